"""The GCS store against fake-gcs-server: the object-store contract, URLs, preconditions."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from urllib.parse import quote

import pytest

from plancache import PlanStore, open_store
from plancache._backends import open_layer
from plancache._backends.gcs import GCSStore
from plancache._keys import plan_object_name
from plancache.testing import ObjectStoreContract, StoreContract, make_plan
from plancache.testing.contract import StoreSpec, WriteRaw
from plancache.testing.servers import CountingProxy, FakeGCS

PREFIX = "plans"

RACE_BOUNDS = {"connect_timeout": 5.0, "read_timeout": 5.0, "timeout": 15.0}
"""Looser per-call bounds for the contract, whose 16-process races load a 2-core machine; the
default bounds are tested in test_faults.py."""


class TestGCSContract(ObjectStoreContract):
    create_method = replace_method = "POST"
    replace_marker = "ifGenerationMatch="
    first_miss_requests = 2  # the listing that tells a missing object from a missing bucket

    @pytest.fixture
    def store_spec(self, gcs_endpoint: str, gcs_bucket: str) -> StoreSpec:
        options = {"endpoint_url": gcs_endpoint, "token": "anon", **RACE_BOUNDS}
        return f"gs://{gcs_bucket}/{PREFIX}", options

    @pytest.fixture
    def request_proxy(self, gcs_proxy: CountingProxy) -> CountingProxy:
        return gcs_proxy

    @pytest.fixture
    def proxied_store_spec(self, gcs_proxy: CountingProxy, gcs_bucket: str) -> StoreSpec:
        return f"gs://{gcs_bucket}/{PREFIX}", {"endpoint_url": gcs_proxy.endpoint, "token": "anon"}

    @pytest.fixture
    def write_object(self, fake_gcs: FakeGCS, gcs_bucket: str) -> WriteRaw:
        return lambda name, data: fake_gcs.put_object(gcs_bucket, f"{PREFIX}/{name}", data)

    @pytest.fixture
    def read_object(self, fake_gcs: FakeGCS, gcs_bucket: str) -> Callable[[str], tuple[str, bytes]]:
        """Through the JSON API: metadata, then the media."""
        api = f"{fake_gcs.endpoint}/storage/v1"
        download = f"{fake_gcs.endpoint}/download/storage/v1"

        def read(name: str) -> tuple[str, bytes]:
            path = f"b/{gcs_bucket}/o/{quote(f'{PREFIX}/{name}', safe='')}"
            with urllib.request.urlopen(f"{api}/{path}", timeout=10) as r:
                content_type = str(json.loads(r.read())["contentType"])
            with urllib.request.urlopen(f"{download}/{path}?alt=media", timeout=10) as r:
                return content_type, bytes(r.read())

        return read


class TestGCSNoPrefixContract(StoreContract):
    supports_processes = False  # the prefixed class runs the process race
    contention_writers = 0  # and the contention race

    @pytest.fixture
    def store_spec(self, gcs_endpoint: str, gcs_bucket: str) -> StoreSpec:
        return f"gcs://{gcs_bucket}", {"endpoint_url": gcs_endpoint, "token": "anon"}

    @pytest.fixture
    def write_raw(self, fake_gcs: FakeGCS, gcs_bucket: str) -> WriteRaw:
        return lambda fp, data: fake_gcs.put_object(gcs_bucket, plan_object_name(fp), data)


def test_url_drops_the_trailing_slash() -> None:
    assert open_store("gs://bucket/a/b/", token="anon").url == "gs://bucket/a/b"


def test_replace_needs_a_generation(fake_gcs: FakeGCS, gcs_bucket: str) -> None:
    store = open_layer(f"gs://{gcs_bucket}/p", endpoint_url=fake_gcs.endpoint, token="anon")
    assert isinstance(store, GCSStore)
    with pytest.raises(TypeError):
        PlanStore(store)._replace(make_plan().fingerprint, b"{}", "etag")
