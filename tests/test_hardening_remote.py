"""Hostile remotes: a slow client opening, endless or looping listings, unexpected answers.

A slow opening is a real one: gcsfs checks a raw token at Google's tokeninfo URL, and the
standard proxy variable sends that check to a server on 127.0.0.1 that never answers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.servers import FakeGCS, SilentServer
from plancache import PlanCache
from plancache.backends.local import LocalStore
from plancache.config import Settings
from plancache.errors import PlanStoreUnavailableError
from tests.plans import FACTORS, GiB, make_plan

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
    LocalStore(tier).put(make_plan())
    cache = PlanCache(_gcs_settings(fake_gcs, str(tier)).open_store, timeout=2.0)
    start = time.monotonic()
    decision = cache.lookup(FACTORS, current_free_memory=80 * GiB)
    assert decision.reason == "hit", decision
    assert time.monotonic() - start < 1.0


def test_opening_a_remote_client_is_bounded(fake_gcs: FakeGCS, slow_token_check: None) -> None:
    store = _gcs_settings(fake_gcs, None).open_store()
    start = time.monotonic()
    with pytest.raises(PlanStoreUnavailableError, match=r"did not open within 5 s"):
        store.get(make_plan().fingerprint)
    assert time.monotonic() - start < 6.0
