"""Session-wide loopback servers for the object-store tests (moto S3, fake-gcs-server).

Each server starts once per session on a free 127.0.0.1 port; each test gets a fresh bucket.
A counting proxy sits in front of each, reset for every test that asks for it; the GCS store
tests reach fake-gcs-server through ``GCSDeletePreconditions`` (``FakeGCS.endpoint``), which
adds the delete and resumable-upload preconditions GCS honours and fake-gcs-server ignores.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from plancache.testing.servers import (
    CountingProxy,
    FakeGCS,
    MotoS3,
    fake_aws_env,
)

pytest_plugins = ["pytester"]  # tests/testing runs contract subclasses as users write them
SLOW_CONTRACT_TESTS = {
    "test_writers_racing_on_one_key_lose_no_observation",
    "test_processes_racing_converge_on_an_undominated_plan",
    "test_processes_adding_incomparable_observations_lose_none",
}
"""The contract's races (processes, and the thread race on one key): marked ``slow`` here,
not in the kit, whose users need not register the marker."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.name.split("[")[0] in SLOW_CONTRACT_TESTS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _fake_aws_credentials() -> Iterator[None]:
    """Fake AWS credentials and no instance-metadata lookups, for every test."""
    with fake_aws_env():
        yield


@pytest.fixture(scope="session")
def moto_s3(_fake_aws_credentials: None) -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGCS]:
    with FakeGCS() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_endpoint(fake_gcs: FakeGCS) -> Iterator[str]:
    """fake-gcs-server behind ``GCSDeletePreconditions`` (preconditions as GCS has them)."""
    yield fake_gcs.endpoint


@pytest.fixture(scope="session")
def _s3_proxy(moto_s3: MotoS3) -> Iterator[CountingProxy]:
    with CountingProxy(moto_s3.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def _gcs_proxy(fake_gcs: FakeGCS) -> Iterator[CountingProxy]:
    with CountingProxy(fake_gcs.endpoint) as proxy:
        yield proxy


@pytest.fixture
def s3_proxy(_s3_proxy: CountingProxy) -> CountingProxy:
    """The counting proxy in front of moto, with no requests recorded yet."""
    _s3_proxy.reset()
    return _s3_proxy


@pytest.fixture
def gcs_proxy(_gcs_proxy: CountingProxy) -> CountingProxy:
    """The counting proxy in front of fake-gcs-server, with no requests recorded yet."""
    _gcs_proxy.reset()
    return _gcs_proxy


def _bucket_name() -> str:
    return f"plancache-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    """A new, empty bucket on the moto server."""
    name = _bucket_name()
    moto_s3.create_bucket(name)
    return name


@pytest.fixture
def gcs_bucket(fake_gcs: FakeGCS) -> str:
    """A new, empty bucket on fake-gcs-server."""
    name = _bucket_name()
    fake_gcs.create_bucket(name)
    return name
