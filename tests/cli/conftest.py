"""Stores for the command's tests: a local one with plans and an invalid record, and fresh
empty ones on the S3 and GCS test servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from plancache import fingerprint, open_store
from plancache.testing import GiB
from plancache.testing.servers import FakeGCS, MotoS3
from tests.cli.helpers import LocalFixture, RemoteSpec, named_plan, record_bytes, write_raw
from tests.helpers import LOOSE_OPTIONS


@pytest.fixture
def store(tmp_path: Path) -> LocalFixture:
    """A local store with three plans (ages 0, 20 and 40 days) and one invalid record."""
    root = tmp_path / "store"
    plans = [
        named_plan("a", kv_gib=3, age_days=0),
        named_plan("b", kv_gib=1, baseline_gib=60, age_days=20, device_name="NVIDIA A10G"),
        named_plan("c", kv_gib=2, baseline_gib=80, age_days=40),
    ]
    s = open_store(str(root))
    for p in plans:
        s.put(p)
    bad = fingerprint({"model": "broken"})
    write_raw(root, bad, record_bytes(kv_cache_memory_bytes=3 * GiB))  # kv > baseline
    return root, plans, bad


@pytest.fixture
def s3_spec(moto_s3: MotoS3, s3_bucket: str) -> RemoteSpec:
    """A fresh empty store on moto (credentials: environment), with loose time bounds for
    the commands' child processes."""
    return f"s3://{s3_bucket}/plans", {"endpoint_url": moto_s3.endpoint, **LOOSE_OPTIONS}


@pytest.fixture
def gcs_spec(fake_gcs: FakeGCS, gcs_bucket: str) -> RemoteSpec:
    """A fresh empty store on fake-gcs-server, with loose time bounds."""
    return f"gs://{gcs_bucket}/plans", {
        "endpoint_url": fake_gcs.endpoint,
        "token": "anon",
        **LOOSE_OPTIONS,
    }


@pytest.fixture(params=["s3", "gcs"])
def remote(request: pytest.FixtureRequest) -> RemoteSpec:
    """A fresh empty store on the S3 or GCS test server."""
    spec: RemoteSpec = request.getfixturevalue(f"{request.param}_spec")
    return spec
