"""The S3 store against moto: the object-store contract, raw s3fs costs, options."""

from __future__ import annotations

from collections.abc import Callable

import boto3
import pytest
import s3fs

from plancache import PlanStore, open_store
from plancache._backends import open_layer
from plancache._backends.s3 import S3Store
from plancache._keys import plan_object_name
from plancache.errors import UnsupportedStoreError
from plancache.testing import ObjectStoreContract, StoreContract, make_plan
from plancache.testing.contract import StoreSpec, WriteRaw
from plancache.testing.servers import CountingProxy, MotoS3

PREFIX = "plans"

RACE_BOUNDS = {"connect_timeout": 5.0, "read_timeout": 5.0, "timeout": 15.0}
"""Looser per-call bounds for the contract, whose 16-process races load a 2-core machine; the
default bounds are tested in test_faults.py."""


class TestS3Contract(ObjectStoreContract):
    create_method = replace_method = "PUT"

    @pytest.fixture
    def store_spec(self, moto_s3: MotoS3, s3_bucket: str) -> StoreSpec:
        return f"s3://{s3_bucket}/{PREFIX}", {"endpoint_url": moto_s3.endpoint, **RACE_BOUNDS}

    @pytest.fixture
    def request_proxy(self, s3_proxy: CountingProxy) -> CountingProxy:
        return s3_proxy

    @pytest.fixture
    def proxied_store_spec(self, s3_proxy: CountingProxy, s3_bucket: str) -> StoreSpec:
        return f"s3://{s3_bucket}/{PREFIX}", {"endpoint_url": s3_proxy.endpoint}

    @pytest.fixture
    def write_object(self, moto_s3: MotoS3, s3_bucket: str) -> WriteRaw:
        return lambda name, data: moto_s3.put_object(s3_bucket, f"{PREFIX}/{name}", data)

    @pytest.fixture
    def read_object(self, moto_s3: MotoS3, s3_bucket: str) -> Callable[[str], tuple[str, bytes]]:
        client = boto3.client("s3", endpoint_url=moto_s3.endpoint)

        def read(name: str) -> tuple[str, bytes]:
            obj = client.get_object(Bucket=s3_bucket, Key=f"{PREFIX}/{name}")
            return obj["ContentType"], obj["Body"].read()

        return read


class TestS3NoPrefixContract(StoreContract):
    supports_processes = False  # the prefixed class runs the process race
    contention_writers = 0  # and the contention race

    @pytest.fixture
    def store_spec(self, moto_s3: MotoS3, s3_bucket: str) -> StoreSpec:
        return f"s3a://{s3_bucket}", {"endpoint_url": moto_s3.endpoint}

    @pytest.fixture
    def write_raw(self, moto_s3: MotoS3, s3_bucket: str) -> WriteRaw:
        return lambda fp, data: moto_s3.put_object(s3_bucket, plan_object_name(fp), data)


@pytest.fixture
def counted(s3_proxy: CountingProxy, s3_bucket: str) -> PlanStore:
    store = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)
    assert isinstance(store.layer, S3Store)
    return store


def test_raw_s3fs_cat_file_costs_two(
    counted: PlanStore, s3_proxy: CountingProxy, s3_bucket: str
) -> None:
    """The baseline the single-request read improves on."""
    plan = make_plan()
    counted.put(plan)
    s3_proxy.reset()
    fs = s3fs.S3FileSystem(endpoint_url=s3_proxy.endpoint, skip_instance_cache=True)
    assert fs.cat_file(f"{s3_bucket}/p/startup_plan_{plan.fingerprint}.json") == plan.encode()
    assert [m for m, _ in s3_proxy.requests] == ["HEAD", "GET"]


def test_timeouts_are_storage_options(moto_s3: MotoS3, s3_bucket: str) -> None:
    store = open_layer(
        f"s3://{s3_bucket}",
        endpoint_url=moto_s3.endpoint,
        connect_timeout=7.0,
        read_timeout=9.0,
        retries=0,
        timeout=20.0,
    )
    assert isinstance(store, S3Store)
    assert (store.timeouts.connect, store.timeouts.read, store.timeouts.retries) == (7.0, 9.0, 0)
    assert store.timeouts.total == 20.0
    assert PlanStore(store).get(make_plan().fingerprint) is None
    with pytest.raises(ValueError):
        open_store(f"s3://{s3_bucket}", timeout=0)


def test_stores_share_botocore_data_and_keep_their_session_options(
    moto_s3: MotoS3, s3_bucket: str
) -> None:
    """Every store of a process parses botocore's service data once (about 100 ms of CPU
    per client otherwise); each store's session keeps its own options (``profile``)."""
    url = f"s3://{s3_bucket}"
    first, second = (open_layer(url, endpoint_url=moto_s3.endpoint) for _ in range(2))
    named = open_layer(url, endpoint_url=moto_s3.endpoint, profile="other")
    assert isinstance(first, S3Store) and isinstance(second, S3Store)
    assert isinstance(named, S3Store)
    sessions = [s.fs.session for s in (first, second, named)]
    assert sessions[0] is not sessions[1] and first._bulk.session is sessions[0]
    loaders = {id(s.get_component("data_loader")) for s in sessions}
    assert len(loaders) == 1
    assert sessions[2].profile == "other" and sessions[0].profile is None
    assert (
        PlanStore(first).get(make_plan().fingerprint) is None
        and list(second.list_objects("")) == []
    )


def test_url_drops_the_trailing_slash() -> None:
    assert open_store("s3://bucket/a/b/").url == "s3://bucket/a/b"


def test_a_url_without_a_bucket_is_rejected() -> None:
    with pytest.raises(ValueError, match="bucket"):
        open_store("s3://")


def test_unknown_storage_option_is_a_clear_error_at_open() -> None:
    with pytest.raises(UnsupportedStoreError, match=r"unknown s3:// storage option.*bogus") as info:
        open_store("s3://bucket/p", bogus=1, secret="hunter2")
    assert "hunter2" not in str(info.value)
