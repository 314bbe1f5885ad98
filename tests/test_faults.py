"""Object stores that fail: every failure is bounded, typed, one line, and free of secrets.

Servers that answer errors replay the bodies S3 and GCS send; a missing bucket is a missing
bucket on moto and fake-gcs-server themselves (fake-gcs-server answers a bare "Not Found" for
a missing object and a missing bucket alike, as GCS answers 404 for both: the store tells
them apart by a listing's status, never by the message's text).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
from google.oauth2.credentials import Credentials

from plancache import PlanCache, PlanStore, open_store
from plancache.errors import (
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)
from plancache.testing import FACTORS, GiB, make_plan
from plancache.testing.hostile import FixedResponseServer, SilentServer
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3, closed_port

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
TOKEN = "ya29.a0-plancache-secret-access-token"


def s3_error(status: int, code: str, message: str) -> FixedResponseServer:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>1</RequestId></Error>"
    )
    return FixedResponseServer(status, body.encode(), {"Content-Type": "application/xml"})


def gcs_error(status: int, message: str) -> FixedResponseServer:
    body = json.dumps({"error": {"code": status, "message": message}})
    return FixedResponseServer(status, body.encode(), {"Content-Type": "application/json"})


def _endpoint(server: AbstractContextManager[Any]) -> Callable[[], AbstractContextManager[str]]:
    """A factory of a context manager that runs ``server`` and gives its endpoint."""

    class _Ctx:
        def __enter__(self) -> str:
            return str(server.__enter__().endpoint)

        def __exit__(self, *exc: object) -> None:
            server.__exit__(None, None, None)

    return _Ctx


# fault -> backend -> (endpoint factory or fixture name, error type, lookup reasons)
S3_DENIED = "Access Denied"
FAULTS: dict[str, dict[str, tuple[Any, type[PlanStoreError], set[str]]]] = {
    "closed-port": {
        b: (
            lambda: nullcontext(f"http://127.0.0.1:{closed_port()}"),
            PlanStoreUnavailableError,
            {"store-error"},
        )
        for b in ("s3", "gcs")
    },
    "silent": {
        b: (lambda: _endpoint(SilentServer())(), PlanStoreUnavailableError, {"timeout"})
        for b in ("s3", "gcs")
    },
    "http-500": {
        "s3": (
            lambda: _endpoint(s3_error(500, "InternalError", "We encountered an internal error"))(),
            PlanStoreUnavailableError,
            {"store-error"},
        ),
        "gcs": (
            lambda: _endpoint(gcs_error(500, "Backend Error"))(),
            PlanStoreUnavailableError,
            {"store-error"},
        ),
    },
    "http-403": {
        "s3": (
            lambda: _endpoint(s3_error(403, "AccessDenied", S3_DENIED))(),
            PlanStorePermissionError,
            {"store-error"},
        ),
        "gcs": (
            lambda: _endpoint(gcs_error(403, "caller does not have storage.objects.get access"))(),
            PlanStorePermissionError,
            {"store-error"},
        ),
    },
    "bad-credentials": {
        "s3": (
            lambda: _endpoint(
                s3_error(
                    403,
                    "InvalidAccessKeyId",
                    "The AWS Access Key Id you provided does not exist in our records.",
                )
            )(),
            PlanStorePermissionError,
            {"store-error"},
        ),
        "gcs": (
            lambda: _endpoint(gcs_error(401, "Invalid Credentials"))(),
            PlanStorePermissionError,
            {"store-error"},
        ),
    },
    "missing-bucket": {
        "s3": ("moto_s3", PlanStoreNotFoundError, {"store-error"}),
        "gcs": ("fake_gcs", PlanStoreNotFoundError, {"store-error"}),
    },
}
CASES = [(f, b) for f in FAULTS for b in ("s3", "gcs")]


def _open(backend: str, endpoint: str, **options: Any) -> PlanStore:
    if backend == "s3":
        return open_store("s3://plancache-missing/p", endpoint_url=endpoint, **options)
    options.setdefault("token", "anon")
    return open_store("gs://plancache-missing/p", endpoint_url=endpoint, **options)


@pytest.fixture(params=CASES, ids=[f"{b}-{f}" for f, b in CASES])
def faulty(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[PlanStore, type[PlanStoreError], set[str]]]:
    fault, backend = request.param
    where, error, reasons = FAULTS[fault][backend]
    if isinstance(where, str):
        server: MotoS3 | FakeGCS = request.getfixturevalue(where)
        ctx: AbstractContextManager[str] = nullcontext(server.endpoint)
    else:
        ctx = where()
    with ctx as endpoint:
        store = _open(backend, endpoint)
        yield store, error, reasons
        store.close()


@pytest.mark.default_bounds  # each call ends within the default total bound (3 s)
def test_direct_calls_raise_typed_one_line_errors(
    faulty: tuple[PlanStore, type[PlanStoreError], set[str]],
) -> None:
    store, error, _ = faulty
    plan = make_plan()
    for call in (lambda: store.get(plan.fingerprint), lambda: store.put(plan)):
        start = time.monotonic()
        with pytest.raises(error) as info:
            call()
        assert time.monotonic() - start < 3 * 3.0  # the 3 s bound; a silent server never ends
        message = str(info.value)
        assert "\n" not in message and message.startswith(store.url), message


def test_cache_is_bounded_and_fails_open(
    faulty: tuple[PlanStore, type[PlanStoreError], set[str]],
) -> None:
    store, _, reasons = faulty
    cache = PlanCache(store, timeout=2.0)
    start = time.monotonic()
    decision = cache.lookup(FACTORS, current_free_memory=80 * GiB)
    assert time.monotonic() - start < 3 * 2.0  # the 2 s budget
    assert decision.reason in reasons and decision.kv_cache_memory_bytes is None
    start = time.monotonic()
    recorded = cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)
    assert time.monotonic() - start < 3 * 2.0  # the 2 s budget
    assert recorded.reason in {"store-error", "timeout"} and recorded.outcome is None


def test_gcs_write_to_a_missing_bucket(fake_gcs: FakeGCS) -> None:
    store = _open("gcs", fake_gcs.endpoint)
    with pytest.raises(PlanStoreNotFoundError, match="does not exist"):
        store.put(make_plan())
    with pytest.raises(PlanStoreNotFoundError):
        list(store.iter_fingerprints())


def test_gcs_tells_a_missing_object_from_a_missing_bucket_by_status(
    fake_gcs: FakeGCS, gcs_bucket: str
) -> None:
    """Both are a 404 with the same text on fake-gcs-server: a listing decides, once per store
    (the bucket's existence is known from then on), whatever the messages say."""
    with CountingProxy(fake_gcs.endpoint) as proxy:
        store = open_store(f"gs://{gcs_bucket}/p", endpoint_url=proxy.endpoint, token="anon")
        fp = make_plan().fingerprint
        assert store.get(fp) is None
        assert [m for m, _ in proxy.requests] == ["GET", "GET"]  # the object, then the listing
        proxy.reset()
        assert store.get(fp) is None and store.layer.delete_object("absent") is False
        assert len(proxy.requests) == 2  # one each: the bucket is known to exist
        store.close()
        missing = open_store("gs://plancache-missing/p", endpoint_url=proxy.endpoint, token="anon")
        with pytest.raises(PlanStoreNotFoundError, match="bucket 'plancache-missing' does not"):
            missing.layer.delete_object("absent")
        missing.close()


def test_retries_are_bounded() -> None:
    with gcs_error(503, "Service Unavailable") as g, s3_error(503, "SlowDown", "Slow") as s:
        for backend, server in (("gcs", g), ("s3", s)):
            with pytest.raises(PlanStoreUnavailableError):
                _open(backend, server.endpoint).get(make_plan().fingerprint)
            assert len(server.requests) == 2, backend
            server.reset()
            with pytest.raises(PlanStoreUnavailableError):
                _open(backend, server.endpoint, retries=0).get(make_plan().fingerprint)
            assert len(server.requests) == 1, backend


@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_secrets_never_leak(backend: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="plancache")
    if backend == "s3":
        server = s3_error(
            403, "SignatureDoesNotMatch", "The request signature we calculated does not match"
        )
        secrets: dict[str, Any] = {"key": "AKIAPLANCACHETEST", "secret": SECRET, "token": TOKEN}
        nested: dict[str, Any] = {"client_kwargs": {"aws_secret_access_key": SECRET}}
    else:
        server = gcs_error(401, "Invalid Credentials")
        secrets = {"token": Credentials(token=TOKEN)}  # type: ignore[no-untyped-call]
        nested = {"session_kwargs": {"headers": {"X-Goog-Api-Key": SECRET}}}
    with server:
        store = _open(backend, server.endpoint, **secrets)
        texts = [repr(store), str(store)]
        try:
            store.get(make_plan().fingerprint)
        except PlanStoreError as exc:
            assert isinstance(exc, PlanStorePermissionError)
            texts += [str(exc), repr(exc)]
        cache = PlanCache(store, timeout=30.0)  # what is printed, not the bound, is tested
        texts.append(repr(cache.lookup(FACTORS, current_free_memory=80 * GiB)))
        texts.append(
            repr(cache.record(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=2 * GiB))
        )
        texts.append(repr(_open(backend, server.endpoint, **nested)))
    texts += [r.getMessage() for r in caplog.records]
    texts += [r.exc_text or "" for r in caplog.records]
    assert any("plancache: lookup store-error" in t for t in texts)
    for text in texts:
        assert SECRET not in text and TOKEN not in text, text


@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_the_hard_bound_holds_whatever_the_client_timeouts(backend: str) -> None:
    with SilentServer() as server:
        store = _open(backend, server.endpoint, read_timeout=30, timeout=0.5)
        start = time.monotonic()
        with pytest.raises(PlanStoreUnavailableError, match=r"no answer within 0\.5 s"):
            store.get(make_plan().fingerprint)
        assert time.monotonic() - start < 30 / 2  # the 0.5 s bound, not the 30 s read


def test_s3_conditional_conflicts_are_lost_races() -> None:
    """AWS may answer 409 ConditionalRequestConflict to a conditional put: re-read, retry."""
    with s3_error(409, "ConditionalRequestConflict", "try again") as server:
        store = _open("s3", server.endpoint)
        fp = make_plan().fingerprint
        assert store._create(fp, b"{}") is False
        assert store._replace(fp, b"{}", '"etag"') is False
    with s3_error(412, "PreconditionFailed", "At least one precondition failed") as server:
        assert _open("s3", server.endpoint)._create(fp, b"{}") is False


def test_gcs_read_without_generation_is_an_error() -> None:
    with FixedResponseServer(200, b"{}") as server:
        store = _open("gcs", server.endpoint)
        with pytest.raises(PlanStoreError, match="x-goog-generation"):
            store.get(make_plan().fingerprint)
