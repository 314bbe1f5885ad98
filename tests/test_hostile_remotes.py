"""Hostile remotes: a slow client opening, endless or looping listings, unexpected answers.

A slow opening is a real one: gcsfs checks a raw token at Google's tokeninfo URL, and the
standard proxy variable sends that check to a server on 127.0.0.1 that never answers.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plancache import PlanCache
from plancache._backends import open_layer
from plancache._backends._remote import RemoteStore
from plancache._backends.local import LocalStore
from plancache._config import Settings
from plancache._inventory.artifacts import names as artifact_names
from plancache._keys import plan_object_name
from plancache._store import PlanStore
from plancache.errors import PlanStoreError, PlanStoreUnavailableError
from plancache.testing import FACTORS, GiB, make_plan
from plancache.testing.hostile import Reply, Respond, ScriptedServer, SilentServer
from plancache.testing.servers import FakeGCS
from tests.helpers import within

TOKEN = "ya29.a0-hardening-raw-access-token"


@pytest.fixture
def slow_token_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with SilentServer() as silent:
        monkeypatch.setenv("HTTPS_PROXY", silent.endpoint)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        yield


def _gcs_settings(fake_gcs: FakeGCS, local_tier: str | None) -> Settings:
    options = {"token": TOKEN, "endpoint_url": fake_gcs.endpoint}
    return Settings("gs://plancache-slow/p", storage_options=options, local_tier=local_tier)


def test_local_tier_answers_while_the_remote_client_opens(
    fake_gcs: FakeGCS, slow_token_check: None, tmp_path: Path
) -> None:
    tier = tmp_path / "tier"
    PlanStore(LocalStore(tier)).put(make_plan())
    cache = PlanCache(_gcs_settings(fake_gcs, str(tier)).open_store, timeout=2.0)
    decision = cache.lookup(FACTORS, current_free_memory=80 * GiB)
    # a hit within the 2 s budget, where the client's opening takes its 5 s bound: the
    # lookup did not wait for it (else "timeout")
    assert decision.reason == "hit", decision


@pytest.mark.default_bounds  # the default 5 s wait for a client to open
def test_opening_a_remote_client_is_bounded(fake_gcs: FakeGCS, slow_token_check: None) -> None:
    store = _gcs_settings(fake_gcs, None).open_store()
    start = time.monotonic()
    with pytest.raises(PlanStoreUnavailableError, match=r"did not open within 5 s"):
        store.get(make_plan().fingerprint)
    assert time.monotonic() - start < 3 * 5.0  # the 5 s bound (the token server never answers)


# -- listings ------------------------------------------------------------------------------
FP = make_plan().fingerprint
S3_PAGE = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    "<Name>hostile</Name><Prefix>p/</Prefix><MaxKeys>1000</MaxKeys>"
    "<IsTruncated>{truncated}</IsTruncated>{contents}{token}</ListBucketResult>"
)


def _s3_page(
    token: str | None,
    contents: str = f"<Contents><Key>p/{plan_object_name(FP)}</Key><Size>1</Size></Contents>",
) -> bytes:
    return S3_PAGE.format(
        truncated="true" if token else "false",
        contents=contents,
        token=f"<NextContinuationToken>{token}</NextContinuationToken>" if token else "",
    ).encode()


def _gcs_page(token: str | None) -> bytes:
    page: dict[str, object] = {"items": [{"name": f"p/{plan_object_name(FP)}"}]}
    if token:
        page["nextPageToken"] = token
    return json.dumps(page).encode()


def _listing(backend: str, page: Callable[[int], bytes]) -> Respond:
    """Listing requests get ``page(n)`` for the n-th one (from 0)."""
    count = itertools.count()
    kind = "application/xml" if backend == "s3" else "application/json"

    def respond(method: str, path: str, body: bytes) -> Reply:
        return 200, {"Content-Type": kind}, page(next(count))

    return respond


def _store(backend: str, endpoint: str) -> RemoteStore:
    if backend == "s3":
        store = open_layer("s3://hostile/p", endpoint_url=endpoint)
    else:
        store = open_layer("gs://hostile/p", endpoint_url=endpoint, token="anon")
    assert isinstance(store, RemoteStore)
    return store


PAGE = {"s3": _s3_page, "gcs": _gcs_page}
LISTERS: dict[str, Callable[[RemoteStore], object]] = {
    "plans": lambda store: list(PlanStore(store).iter_fingerprints()),
    "compile-artifacts": artifact_names,  # every kind lists through the one bounded loop
}


@pytest.mark.parametrize("kind", sorted(LISTERS))
@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_a_repeated_page_token_ends_the_listing(backend: str, kind: str) -> None:
    with ScriptedServer(_listing(backend, lambda n: PAGE[backend]("same"))) as server:
        store = _store(backend, server.endpoint)
        with pytest.raises(PlanStoreUnavailableError, match="repeated a page token"):
            within(10, lambda: LISTERS[kind](store))
        assert len(server.requests) == 2


@pytest.mark.parametrize("kind", sorted(LISTERS))
@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_a_listing_is_bounded_in_pages_and_time(backend: str, kind: str) -> None:
    with ScriptedServer(_listing(backend, lambda n: PAGE[backend](f"t{n}"))) as server:
        store = _store(backend, server.endpoint)
        store.max_list_pages = 5
        with pytest.raises(PlanStoreUnavailableError, match="within 5 pages"):
            within(10, lambda: LISTERS[kind](store))
        assert len(server.requests) == 5
        store.max_list_pages = 10_000
        store.list_timeout = 0.5
        with pytest.raises(PlanStoreUnavailableError, match=r"within 0.5 s"):
            within(30, lambda: LISTERS[kind](store))  # the pages never end: the bound did


GCS_ODD = [
    b"not json",
    b"[]",
    b'{"items": "x"}',
    b'{"items": [{"nom": 1}]}',
    b'{"items": [{"name": 5}]}',
    b'{"nextPageToken": 5}',
]
S3_ODD = [_s3_page(None, "<Contents><Size>1</Size></Contents>")]


@pytest.mark.parametrize(
    ("backend", "body"), [("gcs", b) for b in GCS_ODD] + [("s3", b) for b in S3_ODD]
)
def test_unexpected_listing_answers_are_store_errors(backend: str, body: bytes) -> None:
    with (
        ScriptedServer(_listing(backend, lambda n: body)) as server,
        pytest.raises(PlanStoreError, match="unexpected answer"),
    ):
        store = _store(backend, server.endpoint)
        within(10, lambda: list(PlanStore(store).iter_fingerprints()))
