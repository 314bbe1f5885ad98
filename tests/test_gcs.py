"""The GCS store against fake-gcs-server: the conformance suite, request counts, layout."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from benchmarks.servers import CountingProxy, FakeGCS
from plancache import PutOutcome, open_store
from plancache.backends.gcs import GCSStore
from tests.conformance import StoreContract
from tests.plans import make_plan


class TestGCSContract(StoreContract):
    @pytest.fixture
    def store_spec(self, fake_gcs: FakeGCS, gcs_bucket: str) -> tuple[str, dict[str, Any]]:
        return f"gs://{gcs_bucket}/plans", {"endpoint_url": fake_gcs.endpoint, "token": "anon"}


class TestGCSNoPrefixContract(StoreContract):
    supports_processes = False  # the prefixed class runs the process race

    @pytest.fixture
    def store_spec(self, fake_gcs: FakeGCS, gcs_bucket: str) -> tuple[str, dict[str, Any]]:
        return f"gcs://{gcs_bucket}", {"endpoint_url": fake_gcs.endpoint, "token": "anon"}


@pytest.fixture
def counted(gcs_proxy: CountingProxy, gcs_bucket: str) -> GCSStore:
    store = open_store(f"gs://{gcs_bucket}/p", endpoint_url=gcs_proxy.endpoint, token="anon")
    assert isinstance(store, GCSStore)
    return store


def test_one_request_per_read_and_create(counted: GCSStore, gcs_proxy: CountingProxy) -> None:
    plan = make_plan()
    assert counted.get(plan.fingerprint) is None
    assert [m for m, _ in gcs_proxy.requests] == ["GET"]
    gcs_proxy.reset()
    assert counted.put(plan) is PutOutcome.CREATED
    assert [m for m, _ in gcs_proxy.requests] == ["POST"]
    gcs_proxy.reset()
    assert counted.get(plan.fingerprint) == plan
    assert [m for m, _ in gcs_proxy.requests] == ["GET"]


def test_merge_costs(counted: GCSStore, gcs_proxy: CountingProxy) -> None:
    counted.put(make_plan())
    gcs_proxy.reset()
    assert counted.put(make_plan()) is PutOutcome.KEPT
    assert [m for m, _ in gcs_proxy.requests] == ["POST", "GET"]
    gcs_proxy.reset()
    assert counted.put(make_plan(kv=11 << 30)) is PutOutcome.REPLACED
    assert [m for m, _ in gcs_proxy.requests] == ["POST", "GET", "POST"]
    assert "ifGenerationMatch=" in gcs_proxy.requests[-1][1]


def test_objects_are_readable_by_standard_tools(fake_gcs: FakeGCS, gcs_bucket: str) -> None:
    store = open_store(f"gs://{gcs_bucket}/a/b/", endpoint_url=fake_gcs.endpoint, token="anon")
    assert store.url == f"gs://{gcs_bucket}/a/b"
    plan = make_plan()
    store.put(plan)
    name = f"a%2Fb%2Fstartup_plan_{plan.fingerprint}.json"
    with urllib.request.urlopen(f"{fake_gcs.endpoint}/storage/v1/b/{gcs_bucket}/o/{name}") as r:
        meta = json.loads(r.read())
    assert meta["contentType"] == "application/json"
    url = f"{fake_gcs.endpoint}/download/storage/v1/b/{gcs_bucket}/o/{name}?alt=media"
    with urllib.request.urlopen(url) as r:
        assert r.read() == plan.encode()


def test_listing_pages_and_skips_other_objects(fake_gcs: FakeGCS, gcs_bucket: str) -> None:
    store = open_store(f"gs://{gcs_bucket}/p", endpoint_url=fake_gcs.endpoint, token="anon")
    assert isinstance(store, GCSStore)
    store.list_page_size = 2
    other = open_store(f"gs://{gcs_bucket}/p/sub", endpoint_url=fake_gcs.endpoint, token="anon")
    other.put(make_plan())
    plans = [make_plan(factors={"i": i}) for i in range(5)]
    for p in plans:
        store.put(p)
    assert sorted(store.iter_fingerprints()) == sorted(p.fingerprint for p in plans)


def test_replace_needs_a_generation(counted: GCSStore) -> None:
    with pytest.raises(TypeError):
        counted._replace(make_plan().fingerprint, b"{}", "etag")
