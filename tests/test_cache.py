"""PlanCache: reasons, the time budget, fail-open, logging."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import plancache
from plancache import PlanCache, PlanStoreError, PutOutcome
from plancache import _reasons as reasons
from plancache._backends.local import LocalStore
from plancache._reasons import RECORD_FAILURES, Reason
from plancache._store import PlanStore
from plancache.testing import FACTORS, GiB, make_plan


class StalledStore(PlanStore):
    """Plans in a local directory whose reads and writes wait until ``release`` is set (a
    store that stopped answering), counting the calls that began."""

    def __init__(self, root: Path) -> None:
        super().__init__(LocalStore(root))
        self.release, self.calls = threading.Event(), 0

    def _read(self, fp: str) -> tuple[bytes, object] | None:
        self.calls += 1
        self.release.wait(30)
        return super()._read(fp)

    def _create(self, fp: str, data: bytes) -> bool:
        self.calls += 1
        self.release.wait(30)
        return super()._create(fp, data)


class BrokenStore(PlanStore):
    """Plans in a local directory whose reads fail the way a given exception says."""

    def __init__(self, root: Path, exc: BaseException) -> None:
        super().__init__(LocalStore(root))
        self.exc = exc

    def _read(self, fp: str) -> tuple[bytes, object] | None:
        raise self.exc

    def _create(self, fp: str, data: bytes) -> bool:
        raise self.exc


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PlanStore]:
    yield PlanStore(LocalStore(tmp_path))


def test_miss_then_record_then_hit(store: PlanStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "plancache")
    cache = PlanCache(store)
    d = cache.lookup(FACTORS, 80 * GiB)
    assert (d.kv_cache_memory_bytes, d.reason, d.hit) == (None, "miss", False)
    assert d.fingerprint == make_plan().fingerprint
    r = cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)
    assert (r.outcome, r.reason, r.fingerprint) == (PutOutcome.CREATED, "created", d.fingerprint)
    d = cache.lookup(FACTORS, 80 * GiB)
    assert (d.kv_cache_memory_bytes, d.reason) == (10 * GiB, "hit")
    assert d.plan is not None and d.observation is not None and d.observation.producer["host"]
    lines = [r.getMessage() for r in caplog.records]
    assert d.fingerprint is not None
    assert any("lookup miss fp=" + d.fingerprint[:12] in m and " ms" in m for m in lines)
    assert any("record created" in m for m in lines)
    assert any("lookup hit" in m and "kv=10.00GiB" in m for m in lines)


def test_gate_rejects_when_less_memory_is_free(store: PlanStore) -> None:
    cache = PlanCache(store)
    cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)
    assert cache.lookup(FACTORS, 69 * GiB).reason == "gate:free-memory-below-baseline"
    for unknown in (None, 0, -5, True, 7.5e10):
        d = cache.lookup(FACTORS, unknown)  # type: ignore[arg-type]  # checked at run time
        assert (d.kv_cache_memory_bytes, d.reason) == (None, "gate:free-memory-unknown")


def test_invalid_record_is_a_miss_with_reason(store: PlanStore) -> None:
    store._create(make_plan().fingerprint, b'{"schema": 1, "torn')
    d = PlanCache(store).lookup(FACTORS, 80 * GiB)
    assert (d.kv_cache_memory_bytes, d.reason) == (None, "invalid")
    assert "JSON" in d.detail


def test_bad_factors_and_bad_values_never_raise(store: PlanStore) -> None:
    cache = PlanCache(store)
    assert cache.lookup({"x": float("nan")}, 1).reason == "invalid-factors"
    assert cache.lookup("not a dict", 1).reason == "invalid-factors"  # type: ignore[arg-type]
    for kv, base in [(-1, 5), (10, 5), (True, 5), (1.5, 5), (1, None)]:
        r = cache.record(FACTORS, kv_cache_memory_bytes=kv, free_memory_baseline=base)  # type: ignore[arg-type]
        assert (r.outcome, r.reason) == (None, "invalid-input")
    r = cache.record({"pad": "x" * 70_000}, kv_cache_memory_bytes=1, free_memory_baseline=1)
    assert r.reason == "invalid-input"


def test_a_record_reason_is_the_put_outcome_or_a_failure_reason(store: PlanStore) -> None:
    cache = PlanCache(store)
    kept = [cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2) for _ in "ab"]
    assert [r.reason for r in kept] == [PutOutcome.CREATED, PutOutcome.KEPT]
    assert all(r.reason is r.outcome for r in kept)
    bad = cache.record(FACTORS, kv_cache_memory_bytes=-1, free_memory_baseline=2)
    assert (bad.outcome, bad.reason) == (None, Reason.INVALID_INPUT)
    assert [str(r.reason) for r in (*kept, bad)] == ["created", "kept", "invalid-input"]
    assert RECORD_FAILURES == ("invalid-input", "store-error", "timeout", "error")


@pytest.mark.parametrize("module", [plancache, reasons])
def test_record_reason_is_deprecated_and_equal_to_what_replaced_it(module: object) -> None:
    with pytest.warns(DeprecationWarning, match="RecordReason is deprecated"):
        old = module.RecordReason  # type: ignore[attr-defined]
    assert {m.name: m.value for m in old} == {
        "CREATED": "created",
        "REPLACED": "replaced",
        "KEPT": "kept",
        "INVALID_INPUT": "invalid-input",
        "STORE_ERROR": "store-error",
        "TIMEOUT": "timeout",
        "ERROR": "error",
    }
    assert old.CREATED == PutOutcome.CREATED and old.TIMEOUT == Reason.TIMEOUT
    assert "RecordReason" not in plancache.__all__


@pytest.mark.parametrize(
    ("exc", "reason"),
    [(PlanStoreError("bucket gone"), "store-error"), (RuntimeError("bug"), "error")],
)
def test_store_failures_are_misses(tmp_path: Path, exc: BaseException, reason: str) -> None:
    cache = PlanCache(BrokenStore(tmp_path, exc))
    d = cache.lookup(FACTORS, 80 * GiB)
    assert (d.kv_cache_memory_bytes, d.reason) == (None, reason)
    r = cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2)
    assert (r.outcome, r.reason) == (None, reason)


def test_a_store_that_stalls_is_cut_off_at_the_budget(tmp_path: Path) -> None:
    store = StalledStore(tmp_path)
    cache = PlanCache(store, timeout=0.3)
    try:
        start = time.monotonic()
        d = cache.lookup(FACTORS, 80 * GiB)
        r = cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2)
        elapsed = time.monotonic() - start
        # both returned while the store still stalled (a count, not a clock): the budget
        # cut each off, and each waited its budget out
        assert not store.release.is_set() and store.calls == 2
        assert (d.reason, r.reason) == ("timeout", "timeout")
        assert elapsed >= 0.6 and d.seconds >= 0.3
    finally:
        store.release.set()


def test_store_factory_is_opened_lazily_and_within_budget(tmp_path: Path) -> None:
    calls, release = [], threading.Event()

    def slow_factory() -> PlanStore:
        calls.append(1)
        release.wait(30)  # an open that does not end until the test lets it
        return PlanStore(LocalStore(tmp_path))

    cache = PlanCache(slow_factory, timeout=0.2)
    assert calls == []
    try:
        d = cache.lookup(FACTORS, 1)
        assert not release.is_set()  # it returned while the open still hung: the budget cut it
        assert d.reason == "timeout" and calls == [1]
    finally:
        release.set()


def test_from_env_uses_the_configured_directory(tmp_path: Path) -> None:
    cache = PlanCache.from_env({"PLANCACHE_URL": str(tmp_path), "PLANCACHE_TIMEOUT": "0.5"})
    assert cache.timeout == 0.5
    cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2)
    assert list(PlanStore(LocalStore(tmp_path)).iter_fingerprints()) == [make_plan().fingerprint]


def test_timeout_must_be_positive(store: PlanStore) -> None:
    with pytest.raises(ValueError):
        PlanCache(store, timeout=0)


def test_warm_opens_the_store_in_the_background(tmp_path: Path) -> None:
    release, opened = threading.Event(), threading.Event()

    def slow_factory() -> PlanStore:
        release.wait(10)
        opened.set()
        return PlanStore(LocalStore(tmp_path))

    cache = PlanCache(slow_factory, timeout=0.3)
    cache.warm()  # returns while the store is still opening
    assert not opened.is_set()
    release.set()
    assert opened.wait(5)
    assert cache.lookup(FACTORS, 1).reason == "miss"


def test_warm_never_raises(tmp_path: Path) -> None:
    tried = threading.Event()

    def broken() -> PlanStore:
        tried.set()
        raise PlanStoreError("no such bucket")

    cache = PlanCache(broken, timeout=0.5)
    cache.warm()
    assert tried.wait(10)  # the open failed on the warm-up's thread, raising nothing here
    assert cache.lookup(FACTORS, 1).reason == "store-error"


def test_a_newer_schema_record_is_a_miss_and_is_kept(store: PlanStore) -> None:
    fp = make_plan().fingerprint
    store._create(fp, b'{"schema": 3, "fingerprint": "%s"}' % fp.encode())
    cache = PlanCache(store)
    d = cache.lookup(FACTORS, 80 * GiB)
    assert (d.kv_cache_memory_bytes, d.reason) == (None, "miss")
    assert "schema 3" in d.detail
    r = cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2)
    assert r.outcome is PutOutcome.KEPT


class ExplodingFactors(Mapping[str, int]):
    """A mapping whose reads fail (a caller's broken factor source)."""

    def __getitem__(self, key: str) -> int:
        raise RuntimeError("factor source broke")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("factor source broke")

    def __len__(self) -> int:
        return 1


def test_hostile_values_never_raise(store: PlanStore) -> None:
    cache = PlanCache(store)
    huge = 10**400
    r = cache.record(FACTORS, kv_cache_memory_bytes=huge, free_memory_baseline=huge)
    assert r.reason == "invalid-input"
    cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2)
    assert cache.lookup(FACTORS, huge).reason == "hit"
    d = cache.lookup(ExplodingFactors(), 1)
    assert (d.reason, d.fingerprint) == ("invalid-factors", None)
    assert "factor source broke" in d.detail


def test_a_lookup_runs_on_the_thread_that_opened_the_store(tmp_path: Path) -> None:
    """After ``warm``, a lookup starts no thread of its own: it hands its fetch to the idle
    thread that opened the store (no thread start-up on a boot's critical path)."""
    PlanStore(LocalStore(tmp_path)).put(make_plan())
    threads: list[threading.Thread] = []

    class Recording(PlanStore):
        def _read(self, fp: str) -> tuple[bytes, object] | None:
            threads.append(threading.current_thread())
            return super()._read(fp)

    def factory() -> PlanStore:
        threads.append(threading.current_thread())
        return Recording(LocalStore(tmp_path))

    cache = PlanCache(factory, timeout=5)
    cache.warm()
    for _ in range(500):  # until the warm-up's thread waits for work again
        if threads and threads[0].name == "plancache-idle":
            break
        time.sleep(0.01)
    assert cache.lookup(FACTORS, 80 * GiB).reason == "hit"
    assert cache.lookup(FACTORS, 80 * GiB).reason == "hit"
    assert len(threads) == 3 and threads[0] is threads[1] is threads[2]


def test_what_to_avoid_can_be_worked_out_in_the_lookups_thread(store: PlanStore) -> None:
    """``avoid`` as a function of the key (the plugin's crash recovery) runs in the fetch's
    thread, before the fetch; what it returns is avoided, what it raises fails the lookup (never the
    caller), and a slow one is cut off at the join's bound like a slow fetch."""
    plan = make_plan()
    store.put(plan)
    cache = PlanCache(store, timeout=5)
    ran_on: list[tuple[threading.Thread, str]] = []

    def crashed(key: str) -> set[str]:
        ran_on.append((threading.current_thread(), key))
        return {plan.observations[0].digest}

    pending = cache.start_lookup(FACTORS, 80 * GiB, avoid=crashed)
    d = pending.result(5)
    assert (d.reason, d.kv_cache_memory_bytes) == ("gate:crashed-before", None)
    assert pending.avoid == {plan.observations[0].digest}
    assert len(ran_on) == 1 and ran_on[0][0] is not threading.current_thread()
    assert ran_on[0][1] == plan.fingerprint
    assert cache.start_lookup(FACTORS, 80 * GiB, avoid=lambda key: ()).result(5).reason == "hit"

    def broken(key: str) -> set[str]:
        raise OSError("marks directory unreadable")

    failed = cache.start_lookup(FACTORS, 80 * GiB, avoid=broken).result(5)
    assert failed.reason == "error" and "marks directory unreadable" in failed.detail

    release = threading.Event()

    def stalled(key: str) -> set[str]:
        release.wait(30)
        return set()

    try:
        late = cache.start_lookup(FACTORS, 80 * GiB, avoid=stalled).result(0.3)
        assert late.reason == "timeout" and not release.is_set()  # cut off while it stalled
    finally:
        release.set()
