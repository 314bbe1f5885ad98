"""``plancache ls`` and ``plancache stats``: what a store holds, at a glance."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plancache import fingerprint, open_store
from plancache.testing import GiB, child_env
from tests.cli.helpers import (
    DAY,
    LocalFixture,
    failure,
    frontier_plan,
    ok,
    record_bytes,
    write_raw,
)


def test_ls_lists_plans_and_invalid_records(store: LocalFixture) -> None:
    root, plans, bad = store
    text = ok("ls", str(root))
    lines = text.splitlines()
    headers = ["FINGERPRINT", "MODEL", "DEVICE", "OBS", "MAX", "KV", "GiB", "MIN", "BASELINE"]
    assert lines[0].split() == [*headers, "GiB", "AGE", "HOST"]
    assert [line[:12] for line in lines[1:4]] == [p.fingerprint[:12] for p in plans]  # newest 1st
    assert lines[2].split()[1:] == ["b", "NVIDIA", "A10G", "1", "1.00", "60.00", "20d", "host-b"]
    assert bad[:12] in text and "exceeds free_memory_baseline" in text
    assert lines[-1] == f"3 plans, 1 invalid, in {root}"

    rows = json.loads(ok("ls", str(root), "--json", "--sort", "kv"))
    valid = [r for r in rows if r["valid"]]
    assert [r["max_kv_cache_memory_bytes"] for r in valid] == [3 * GiB, 2 * GiB, 1 * GiB]
    assert valid[0]["fingerprint"] == plans[0].fingerprint
    assert valid[0]["device"] == "NVIDIA H100" and valid[0]["producer"]["host"] == "host-a"
    assert (valid[0]["model"], valid[0]["observations"], valid[0]["labels"]) == (
        "a",
        [plans[0].observations[0].to_dict()],
        {"model": "a"},
    )
    assert rows[-1] == {
        "fingerprint": bad,
        "valid": False,
        "error": rows[-1]["error"],
        "bytes": rows[-1]["bytes"],
    }
    assert "exceeds" in rows[-1]["error"]

    by_baseline = json.loads(ok("ls", str(root), "--json", "--sort", "baseline"))
    assert [r["min_free_memory_baseline"] for r in by_baseline if r["valid"]] == [
        80 * GiB,
        70 * GiB,
        60 * GiB,
    ]
    by_device = json.loads(ok("ls", str(root), "--json", "--sort", "device"))
    assert by_device[0]["device"] == "NVIDIA A10G"
    by_fp = json.loads(ok("ls", str(root), "--json", "--sort", "fp"))
    fps = [r["fingerprint"] for r in by_fp if r["valid"]]
    assert fps == sorted(fps)


def test_ls_uses_the_environment(tmp_path: Path, store: LocalFixture) -> None:
    root, plans, _ = store
    assert plans[0].fingerprint[:12] in ok("ls", env=child_env(PLANCACHE_URL=str(root)))
    default = tmp_path / "vllm-cache" / "startup_plan"  # {VLLM_CACHE_ROOT}/startup_plan
    open_store(str(default)).put(plans[1])
    out = ok("ls", "--json", env=child_env(VLLM_CACHE_ROOT=str(default.parent)))
    assert [r["fingerprint"] for r in json.loads(out)] == [plans[1].fingerprint]
    err = failure("ls", env=child_env(PLANCACHE_URL=str(root), PLANCACHE_TIMEOUT="soon"))
    assert err.startswith("plancache: error: PLANCACHE_TIMEOUT='soon'")


def test_local_commands_import_no_cloud_client(store: LocalFixture) -> None:
    root, _, _ = store
    code = (
        "import sys; from plancache._command.cli import main; main(['stats', sys.argv[1]]); "
        "print(sorted(m for m in ('s3fs', 'gcsfs', 'botocore') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_stats(store: LocalFixture) -> None:
    root, plans, _ = store
    stats = json.loads(ok("stats", str(root), "--json"))
    size = sum(f.stat().st_size for f in root.glob("startup_plan_*.json"))
    assert stats["url"] == str(root)
    assert (stats["plans"], stats["invalid"], stats["bytes"]) == (3, 1, size)
    assert stats["oldest"] == pytest.approx(plans[2].created_at)
    assert stats["newest"] == pytest.approx(plans[0].created_at)
    assert stats["devices"] == {"NVIDIA H100": 2, "NVIDIA A10G": 1}
    text = ok("stats", str(root))
    assert "3 (1 invalid)" in text and "(40d ago)" in text
    assert "NVIDIA H100 (2), NVIDIA A10G (1)" in text


def _documented_stats_fields() -> list[str]:
    """The fields docs/cli.md's table after "`stats --json` prints one object" lists."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    table = text.split("`stats --json` prints one object", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^\| `(\w+)` \|", table, re.M)


def test_stats_json_prints_exactly_the_documented_fields(store: LocalFixture) -> None:
    root, _, _ = store
    assert list(json.loads(ok("stats", str(root), "--json"))) == _documented_stats_fields()


def test_ls_shows_the_frontier_of_each_record(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    s = open_store(str(root))
    wide = frontier_plan("wide", [(10, 70, 3), (9.5, 66, 4), (11, 75, 1), (9, 68, 2)])
    assert len(wide.observations) == 3  # (9, 68) is dominated by (9.5, 66)
    s.put(wide)
    legacy_factors = {"model": "old", "device_name": "NVIDIA H100"}  # written by plancache 0.1.0
    legacy = fingerprint(legacy_factors)
    write_raw(
        root,
        legacy,
        record_bytes(
            factors=legacy_factors, producer={"host": "h-old"}, created_at=time.time() - 2 * DAY
        ),
    )

    lines = ok("ls", str(root), "--sort", "kv").splitlines()
    assert lines[1].split() == [
        wide.fingerprint[:12],
        "wide",
        "NVIDIA",
        "H100",
        "3",
        "11.00",
        "66.00",
        "1d",
        "host-wide",
    ]
    assert lines[2].split() == [
        legacy[:12],
        "-",
        "NVIDIA",
        "H100",
        "1",
        "1.00",
        "2.00",
        "2d",
        "h-old",
    ]
    assert lines[-1] == f"2 plans, 0 invalid, in {root}"
    rows = {r["fingerprint"]: r for r in json.loads(ok("ls", str(root), "--json"))}
    # the extremes are named as such; the points are the observations, as stored
    assert rows[wide.fingerprint]["max_kv_cache_memory_bytes"] == 11 * GiB
    assert rows[wide.fingerprint]["min_free_memory_baseline"] == 66 * GiB
    points = rows[wide.fingerprint]["observations"]
    assert points == [o.to_dict() for o in wide.observations]
    assert [(o["kv_cache_memory_bytes"], o["free_memory_baseline"]) for o in points] == [
        (int(9.5 * GiB), 66 * GiB),
        (10 * GiB, 70 * GiB),
        (11 * GiB, 75 * GiB),
    ]
    assert {o["producer"]["host"] for o in points} == {"host-wide"}
    assert "kv_cache_memory_bytes" not in rows[wide.fingerprint]
    assert "free_memory_baseline" not in rows[wide.fingerprint]
    assert rows[wide.fingerprint]["model"] == "wide"
    assert (rows[legacy]["model"], len(rows[legacy]["observations"]), rows[legacy]["labels"]) == (
        "-",
        1,
        {},
    )
