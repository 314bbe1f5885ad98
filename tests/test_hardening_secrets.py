"""No secret in clear: not in a repr, an error, its traceback, a decision's detail or a log line.

Secrets are recognised by value (the storage options' secret values, URL user information),
not only by option name.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator

import pytest

from plancache import PlanCache, open_store
from plancache.config import Settings
from plancache.errors import PlanStoreError
from plancache.testing import FACTORS, GiB, make_plan
from plancache.testing.servers import FakeGCS, closed_port

TOKEN = "ya29.a0-hardening-raw-access-token"
PASSWORD = "pa55-hardening-url-password"
CONNECTION = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c29tZS1rZXk-hardening"
SAS = "sv=2024-01-01&sig=hardening-sas-signature"
ACCOUNT_KEY = "hardening-account-key-value"


def _chain_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@pytest.fixture
def offline_token_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """gcsfs checks a raw token at Google's tokeninfo URL (the token in its query): send it
    to a closed port on 127.0.0.1 through the standard proxy variable, so the check fails."""
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    yield


def test_gcs_token_is_in_no_detail_log_line_or_traceback(
    fake_gcs: FakeGCS, offline_token_check: None, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        "gs://plancache-secrets/p",
        storage_options={"token": TOKEN, "endpoint_url": fake_gcs.endpoint},
        local_tier=None,
    )
    caplog.set_level(logging.INFO, logger="plancache")
    cache = PlanCache(settings.open_store, timeout=2.0)
    decision = cache.lookup(FACTORS, current_free_memory=80 * GiB)
    recorded = cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)
    assert decision.reason == "store-error" and decision.detail, decision
    assert recorded.reason == "store-error" and recorded.detail, recorded
    assert TOKEN not in decision.detail and TOKEN not in recorded.detail
    assert "plancache: lookup store-error" in caplog.text
    assert TOKEN not in caplog.text
    with pytest.raises(PlanStoreError) as info:
        settings.open_store().get(make_plan().fingerprint)  # the remote opens on first use
    assert "credentials" in str(info.value)
    assert TOKEN not in _chain_text(info.value)
    assert TOKEN not in repr(settings)


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_endpoint_userinfo_is_in_no_repr_error_or_traceback(scheme: str) -> None:
    endpoint = f"http://hardening:{PASSWORD}@127.0.0.1:{closed_port()}"
    options = {"endpoint_url": endpoint, **({"token": "anon"} if scheme == "gs" else {})}
    settings = Settings(f"{scheme}://user:{PASSWORD}@bucket/p", storage_options=options)
    store = open_store(f"{scheme}://bucket/p", **options)
    for text in (repr(store), repr(settings), str(settings)):
        assert PASSWORD not in text, text
    assert "127.0.0.1" in repr(store)  # the endpoint itself still shows
    for call in (lambda: store.get(make_plan().fingerprint), lambda: store.put(make_plan())):
        with pytest.raises(PlanStoreError) as info:
            call()
        assert PASSWORD not in _chain_text(info.value)
    store.close()


def test_other_secret_options_are_masked() -> None:
    options = {"connection_string": CONNECTION, "sas_token": SAS, "account_key": ACCOUNT_KEY}
    settings = Settings("memory://plancache-secrets", storage_options=options)
    store = open_store("memory://plancache-secrets", **options)
    for text in (repr(store), repr(settings)):
        for secret in (CONNECTION, SAS, ACCOUNT_KEY, "hardening"):
            assert secret not in text, text
