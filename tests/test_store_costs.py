"""The object-store cost benchmark runs and counts what the stores promise; the helpers that
other benchmarks use to get a loopback store work from a clean environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.servers import FAKE_AWS_ENV, gcs_server, s3_server
from benchmarks.store_costs import measure_remote
from plancache import PutOutcome, open_store
from tests.plans import make_plan


def test_measure_remote_reports_requests_per_operation() -> None:
    result = measure_remote(n=3)
    for backend in ("s3", "gcs"):
        assert result[backend]["requests"] == {
            "get_miss": 1.0,
            "put_create": 1.0,
            "get_hit": 1.0,
            "put_kept": 2.0,
            "put_merge": 3.0,
            "lookup_miss": 1.0,
            "record": 1.0,
            "lookup_hit": 1.0,
        }
        for op, p in result[backend].items():
            if op != "requests":
                assert p["n"] > 0 and p["p50_us"] <= p["p99_us"]
    assert result["s3fs_cat_file"]["requests"] == {"get_hit": 2.0}


def test_server_helpers_serve_child_processes_without_aws_environment() -> None:
    env = {k: v for k, v in os.environ.items() if k not in FAKE_AWS_ENV}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    code = "import json,sys; from plancache import open_store; from tests.plans import make_plan\n"
    code += "url, opts = json.loads(sys.argv[1]); print(open_store(url, **opts).put(make_plan()))"
    for server in (s3_server, gcs_server):
        with server() as (url, options):
            out = subprocess.run(
                [sys.executable, "-c", code, json.dumps([url + "/x", options])],
                env=env,
                cwd=Path(__file__).parents[1],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            assert out.stdout.strip() == "PutOutcome.CREATED"
            assert open_store(url + "/x", **options).put(make_plan()) is PutOutcome.KEPT
