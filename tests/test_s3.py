"""The S3 store against moto: the conformance suite, request counts, object layout."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
import s3fs

from benchmarks.servers import CountingProxy, MotoS3
from plancache import PutOutcome, open_store
from plancache.backends.s3 import S3Store
from plancache.errors import UnsupportedStoreError
from tests.conformance import StoreContract
from tests.plans import make_plan


class TestS3Contract(StoreContract):
    @pytest.fixture
    def store_spec(self, moto_s3: MotoS3, s3_bucket: str) -> tuple[str, dict[str, Any]]:
        return f"s3://{s3_bucket}/plans", {"endpoint_url": moto_s3.endpoint}


class TestS3NoPrefixContract(StoreContract):
    supports_processes = False  # the prefixed class runs the process race

    @pytest.fixture
    def store_spec(self, moto_s3: MotoS3, s3_bucket: str) -> tuple[str, dict[str, Any]]:
        return f"s3a://{s3_bucket}", {"endpoint_url": moto_s3.endpoint}


@pytest.fixture
def counted(s3_proxy: CountingProxy, s3_bucket: str) -> S3Store:
    store = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)
    assert isinstance(store, S3Store)
    return store


def test_one_request_per_read_and_create(counted: S3Store, s3_proxy: CountingProxy) -> None:
    plan = make_plan()
    assert counted.get(plan.fingerprint) is None
    assert [m for m, _ in s3_proxy.requests] == ["GET"]
    s3_proxy.reset()
    assert counted.put(plan) is PutOutcome.CREATED
    assert [m for m, _ in s3_proxy.requests] == ["PUT"]
    s3_proxy.reset()
    assert counted.get(plan.fingerprint) == plan
    assert [m for m, _ in s3_proxy.requests] == ["GET"]


def test_merge_costs(counted: S3Store, s3_proxy: CountingProxy) -> None:
    counted.put(make_plan())
    s3_proxy.reset()
    assert counted.put(make_plan()) is PutOutcome.KEPT
    assert [m for m, _ in s3_proxy.requests] == ["PUT", "GET"]
    s3_proxy.reset()
    assert counted.put(make_plan(kv=11 << 30)) is PutOutcome.REPLACED
    assert [m for m, _ in s3_proxy.requests] == ["PUT", "GET", "PUT"]


def test_raw_s3fs_cat_file_costs_two(
    counted: S3Store, s3_proxy: CountingProxy, s3_bucket: str
) -> None:
    """The baseline the single-request read improves on."""
    plan = make_plan()
    counted.put(plan)
    s3_proxy.reset()
    fs = s3fs.S3FileSystem(endpoint_url=s3_proxy.endpoint, skip_instance_cache=True)
    assert fs.cat_file(f"{s3_bucket}/p/startup_plan_{plan.fingerprint}.json") == plan.encode()
    assert [m for m, _ in s3_proxy.requests] == ["HEAD", "GET"]


def test_objects_are_readable_by_standard_tools(moto_s3: MotoS3, s3_bucket: str) -> None:
    store = open_store(f"s3://{s3_bucket}/a/b/", endpoint_url=moto_s3.endpoint)
    assert store.url == f"s3://{s3_bucket}/a/b"
    plan = make_plan()
    store.put(plan)
    obj = boto3.client("s3", endpoint_url=moto_s3.endpoint).get_object(
        Bucket=s3_bucket, Key=f"a/b/startup_plan_{plan.fingerprint}.json"
    )
    assert obj["ContentType"] == "application/json"
    assert obj["Body"].read() == plan.encode()


def test_other_objects_under_the_prefix_are_ignored(moto_s3: MotoS3, s3_bucket: str) -> None:
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint)
    plan = make_plan()
    for key in [
        "p/notes.txt",
        "p/startup_plan_zz.json",
        f"p/sub/startup_plan_{plan.fingerprint}.json",
    ]:
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"{}")
    store = open_store(f"s3://{s3_bucket}/p", endpoint_url=moto_s3.endpoint)
    assert list(store.iter_fingerprints()) == []
    store.put(plan)
    assert list(store.iter_fingerprints()) == [plan.fingerprint]


def test_listing_pages(moto_s3: MotoS3, s3_bucket: str) -> None:
    store = open_store(f"s3://{s3_bucket}", endpoint_url=moto_s3.endpoint)
    assert isinstance(store, S3Store)
    store.list_page_size = 2
    plans = [make_plan(factors={"i": i}) for i in range(5)]
    for p in plans:
        store.put(p)
    assert sorted(store.iter_fingerprints()) == sorted(p.fingerprint for p in plans)


def test_timeouts_are_storage_options(moto_s3: MotoS3, s3_bucket: str) -> None:
    store = open_store(
        f"s3://{s3_bucket}",
        endpoint_url=moto_s3.endpoint,
        connect_timeout=0.2,
        read_timeout=0.3,
        retries=0,
        timeout=1.0,
    )
    assert isinstance(store, S3Store)
    assert (store.timeouts.connect, store.timeouts.read, store.timeouts.retries) == (0.2, 0.3, 0)
    assert store.timeouts.total == 1.0
    assert store.get(make_plan().fingerprint) is None
    with pytest.raises(ValueError):
        open_store(f"s3://{s3_bucket}", timeout=0)


def test_a_url_without_a_bucket_is_rejected() -> None:
    with pytest.raises(ValueError, match="bucket"):
        open_store("s3://")


def test_unknown_storage_option_is_a_clear_error_at_open() -> None:
    with pytest.raises(UnsupportedStoreError, match=r"unknown s3:// storage option.*bogus") as info:
        open_store("s3://bucket/p", bogus=1, secret="hunter2")
    assert "hunter2" not in str(info.value)
