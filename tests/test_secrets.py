"""No secret in clear: not in a repr, an error, its traceback, a decision's detail or a log line.

Secrets are recognised by value (the storage options' secret values, URL user information),
not only by option name.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Iterator

import google.oauth2.credentials
import pytest

from plancache import PlanCache, PlanStore, open_store
from plancache._backends.gcs import REASON_CHARS
from plancache._config import Settings
from plancache.errors import PlanStoreError
from plancache.testing import FACTORS, GiB, make_plan
from plancache.testing.hostile import EchoingServer, FixedResponseServer
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
    cache = PlanCache(settings.open_store, timeout=30.0)  # the reasons, not the bound, are tested
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


# -- endpoints that echo the credentials they got ----------------------------------------------
KEY_ID, SECRET_KEY = "AKIAHARDENINGECHO001", "hardening-echo-secret-access-key"
SESSION_TOKEN = "HardeningEchoSessionToken001"  # letters and digits: a plausible S3 error code
BEARER = "ya29.hardening-echo-bearer-token"
ECHOED = (KEY_ID, SECRET_KEY, SESSION_TOKEN, BEARER)


def _everything_printed(
    store: PlanStore, caplog: pytest.LogCaptureFixture
) -> tuple[PlanCache, list[str]]:
    """What the library shows of a store that fails every call: the details of a lookup, a
    record and a retraction, its log lines, the traceback of a read, the store's repr."""
    caplog.set_level(logging.DEBUG, logger="plancache")
    cache = PlanCache(store, timeout=10.0)
    plan = make_plan()
    details = [
        cache.lookup(FACTORS, current_free_memory=80 * GiB).detail,
        cache.record(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=2 * GiB).detail,
    ]
    assert not cache.retract(plan.fingerprint, plan.observations[0])
    with pytest.raises(PlanStoreError) as info:
        store.get(plan.fingerprint)
    return cache, [*details, caplog.text, _chain_text(info.value), repr(store)]


@pytest.mark.parametrize("code", ["key", "token"])
def test_s3_credentials_the_client_resolved_are_masked_when_an_endpoint_echoes_them(
    code: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)  # botocore's chain, not storage options
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    with EchoingServer("s3", code=code) as server:
        store = open_store("s3://echo/p", endpoint_url=server.endpoint)
        _, texts = _everything_printed(store, caplog)
        store.close()
        assert server.seen[-1][code] == {"key": KEY_ID, "token": SESSION_TOKEN}[code]
    assert "access denied: *** (HTTP 403)" in texts[0]
    for text in texts:
        assert not any(secret in text for secret in ECHOED), text


def test_a_gcs_token_the_client_sent_is_masked_when_an_endpoint_echoes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with EchoingServer("gcs") as server:
        # a credentials object, not a string: no storage option holds the token to mask
        token = google.oauth2.credentials.Credentials(BEARER)  # type: ignore[no-untyped-call]
        store = open_store("gs://echo/p", endpoint_url=server.endpoint, token=token)
        _, texts = _everything_printed(store, caplog)
        store.close()
        assert server.seen[-1]["bearer"] == BEARER
    assert "access denied: HTTP 403: not allowed: bearer=***" in texts[0]
    for text in texts:
        assert BEARER not in text, text


def test_what_an_error_body_gives_is_cut_to_a_safe_set_and_length() -> None:
    long_code = b"<Error><Code>" + b"A" * 65 + b"</Code><Message>m</Message></Error>"
    with FixedResponseServer(403, long_code) as server:
        store = open_store("s3://odd/p", endpoint_url=server.endpoint)
        with pytest.raises(PlanStoreError, match=r"access denied: error \(HTTP 403\)$"):
            store.get(make_plan().fingerprint)
        store.close()
    message = "\x1b[31mred\x07 caf\u00e9 \u202e" + "x" * 4000
    body = json.dumps({"error": {"code": 403, "message": message}}).encode()
    with FixedResponseServer(403, body) as server:
        store = open_store("gs://odd/p", endpoint_url=server.endpoint, token="anon")
        with pytest.raises(PlanStoreError) as info:
            store.get(make_plan().fingerprint)
        store.close()
    reason = str(info.value).partition("HTTP 403: ")[2]
    assert reason.startswith(r"\x1b[31mred\x07 caf\xe9 \u202exxx") and len(reason) == REASON_CHARS
    assert all(" " <= c <= "~" for c in str(info.value))
