"""The store contract, as one base class every backend's tests subclass.

A subclass provides a ``store_spec`` fixture returning ``(url, storage_options)`` that names
a fresh, empty store for each test. A backend is done when it passes all of this.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from plancache import InvalidPlanError, Plan, PlanStore, PutOutcome, open_store
from plancache.errors import UnsupportedSchemaError
from plancache.merge import covers, frontier
from plancache.plan import MAX_OBSERVATIONS, MAX_RECORD_BYTES
from tests.plans import GiB, make_plan

BAD_KEYS = [
    "",
    "../../etc/passwd",
    "A" * 64,
    "g" * 64,
    "a" * 63,
    "a" * 65,
    "a" * 63 + "/",
    None,
    123,
]


def _race_worker(url: str, options: dict[str, Any], seed: int, count: int) -> list[list[int]]:
    """Put ``count`` random plans for FACTORS; return the (kv, baseline) pairs written."""
    store = open_store(url, **options)
    rng = random.Random(seed)
    written = []
    for _ in range(count):
        baseline = rng.randint(40, 80) * GiB
        kv = rng.randint(1, 40) * GiB
        store.put(make_plan(kv, baseline))
        written.append([kv, baseline])
    store.close()
    return written


def _staircase_worker(url: str, options: dict[str, Any], index: int) -> list[int]:
    """Put one observation that no other process's dominates: baseline and KV grow with
    ``index``. Returns the (kv, baseline) written."""
    store = open_store(url, **options)
    kv, baseline = (1 + index) * GiB, (40 + index) * GiB
    store.put(make_plan(kv, baseline))
    store.close()
    return [kv, baseline]


class StoreContract:
    """Every store contract test, run against the store ``store_spec`` names."""

    #: False for stores that live in one process only (``memory://``).
    supports_processes = True
    race_processes = 16
    race_puts_each = 3

    @pytest.fixture
    def store(self, store_spec: tuple[str, dict[str, Any]]) -> Iterator[PlanStore]:
        url, options = store_spec
        store = open_store(url, **options)
        yield store
        store.close()

    def assert_not_dominated(self, store: PlanStore, written: list[Plan]) -> None:
        """The stored frontier is exactly the frontier of every observation written: each
        one is in it or dominated by a point of it, and each point was written."""
        final = store.get(written[0].fingerprint)
        assert final is not None
        observations = [o for p in written for o in p.observations]
        points = {(o.kv_cache_memory_bytes, o.free_memory_baseline) for o in observations}
        for o in final.observations:
            assert (o.kv_cache_memory_bytes, o.free_memory_baseline) in points
        if len(final.observations) < MAX_OBSERVATIONS:
            lost = [o for o in observations if not covers(final.observations, o)]
            assert not lost, f"observations lost: {lost[:3]}"
        expected = frontier(observations)
        assert [(o.kv_cache_memory_bytes, o.free_memory_baseline) for o in final.observations] == [
            (o.kv_cache_memory_bytes, o.free_memory_baseline) for o in expected
        ]

    def test_get_missing_is_none(self, store: PlanStore) -> None:
        assert store.get(make_plan().fingerprint) is None

    def test_put_creates_then_round_trips(self, store: PlanStore) -> None:
        plan = make_plan()
        assert store.put(plan) is PutOutcome.CREATED
        assert store.get(plan.fingerprint) == plan
        assert store.read_raw(plan.fingerprint) == plan.encode()

    def test_same_plan_again_is_kept(self, store: PlanStore) -> None:
        store.put(make_plan())
        assert store.put(make_plan()) is PutOutcome.KEPT

    @pytest.mark.parametrize(
        ("kv", "baseline"), [(11 * GiB, 70 * GiB), (10 * GiB, 60 * GiB), (12 * GiB, 65 * GiB)]
    )
    def test_dominating_plan_replaces(self, store: PlanStore, kv: int, baseline: int) -> None:
        store.put(make_plan())
        better = make_plan(kv, baseline)
        assert store.put(better) is PutOutcome.REPLACED
        assert store.get(better.fingerprint) == better

    @pytest.mark.parametrize(
        ("kv", "baseline"), [(9 * GiB, 70 * GiB), (10 * GiB, 71 * GiB), (10 * GiB, 70 * GiB)]
    )
    def test_dominated_or_equal_observation_is_kept(
        self, store: PlanStore, kv: int, baseline: int
    ) -> None:
        first = make_plan()
        store.put(first)
        assert store.put(make_plan(kv, baseline)) is PutOutcome.KEPT
        assert store.get(first.fingerprint) == first

    @pytest.mark.parametrize(
        ("kv", "baseline"), [(12 * GiB, 75 * GiB), (9 * GiB, 60 * GiB), (1 * GiB, 1 * GiB)]
    )
    def test_an_incomparable_observation_joins_the_frontier(
        self, store: PlanStore, kv: int, baseline: int
    ) -> None:
        first, other = make_plan(), make_plan(kv, baseline)
        store.put(first)
        assert store.put(other) is PutOutcome.REPLACED
        stored = store.get(first.fingerprint)
        assert stored is not None
        assert stored.observations == frontier((*first.observations, *other.observations))
        assert len(stored.observations) == 2
        assert store.put(other) is PutOutcome.KEPT and store.put(first) is PutOutcome.KEPT

    def test_a_schema_1_record_applies_and_is_upgraded_by_the_next_write(
        self, store: PlanStore
    ) -> None:
        plan = make_plan()
        (o,) = plan.observations
        legacy = {"schema": 1, "fingerprint": plan.fingerprint, "factors": dict(plan.factors)}
        assert store._create(plan.fingerprint, orjson.dumps(legacy | o.to_dict()))
        read = store.get(plan.fingerprint)
        assert read is not None and read.schema == 1 and read.observations == plan.observations
        assert store.put(plan) is PutOutcome.REPLACED  # same point, written as schema 2
        raw = store.read_raw(plan.fingerprint)
        assert raw is not None and orjson.loads(raw)["schema"] == 2
        assert store.get(plan.fingerprint) == plan
        assert store.put(plan) is PutOutcome.KEPT

    def test_plans_of_other_factors_do_not_interact(self, store: PlanStore) -> None:
        a, b = make_plan(), make_plan(5 * GiB, 50 * GiB, {"model": "other"})
        assert store.put(a) is PutOutcome.CREATED
        assert store.put(b) is PutOutcome.CREATED
        assert store.get(a.fingerprint) == a and store.get(b.fingerprint) == b

    @pytest.mark.parametrize(
        "raw",
        [b"", b"{", b"[]", b'{"schema": 1}', b"\xff\xfe", b"x" * (MAX_RECORD_BYTES + 10)],
        ids=["empty", "torn", "array", "partial", "binary", "oversized"],
    )
    def test_invalid_record_is_reported_then_replaced(self, store: PlanStore, raw: bytes) -> None:
        plan = make_plan()
        assert store._create(plan.fingerprint, raw)
        with pytest.raises(InvalidPlanError):
            store.get(plan.fingerprint)
        assert store.put(plan) is PutOutcome.REPLACED
        assert store.get(plan.fingerprint) == plan

    def test_record_of_another_schema_version_is_never_overwritten(self, store: PlanStore) -> None:
        plan = make_plan()
        newer = orjson.dumps({"schema": 3, "fingerprint": plan.fingerprint, "future": [1]})
        assert store._create(plan.fingerprint, newer)
        with pytest.raises(UnsupportedSchemaError):
            store.get(plan.fingerprint)
        assert store.put(make_plan(kv=20 * GiB)) is PutOutcome.KEPT
        assert store.read_raw(plan.fingerprint) == newer

    def test_record_stored_under_another_key_is_invalid(self, store: PlanStore) -> None:
        plan, other = make_plan(), make_plan(factors={"model": "other"})
        store._create(other.fingerprint, plan.encode())
        with pytest.raises(InvalidPlanError, match="key"):
            store.get(other.fingerprint)

    def test_delete(self, store: PlanStore) -> None:
        plan = make_plan()
        assert store.delete(plan.fingerprint) is False
        store.put(plan)
        assert store.delete(plan.fingerprint) is True
        assert store.get(plan.fingerprint) is None
        assert store.put(plan) is PutOutcome.CREATED

    def test_iter_fingerprints_lists_exactly_the_plans(self, store: PlanStore) -> None:
        assert list(store.iter_fingerprints()) == []
        plans = [make_plan(factors={"model": f"m{i}"}) for i in range(5)]
        for p in plans:
            store.put(p)
        assert sorted(store.iter_fingerprints()) == sorted(p.fingerprint for p in plans)

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_bad_keys_are_rejected_before_io(self, store: PlanStore, key: Any) -> None:
        for call in (store.get, store.delete, store.read_raw):
            with pytest.raises(ValueError):
                call(key)

    def test_url_and_repr_name_the_store(self, store: PlanStore, store_spec: Any) -> None:
        assert isinstance(store.url, str) and store.url
        assert store.url in repr(store)

    def test_threads_racing_converge_on_an_undominated_plan(self, store: PlanStore) -> None:
        rng = random.Random(7)
        plans = [make_plan(rng.randint(1, 40) * GiB, rng.randint(40, 80) * GiB) for _ in range(16)]
        barrier = threading.Barrier(len(plans))
        errors: list[BaseException] = []

        def put(p: Plan) -> None:
            barrier.wait()
            try:
                store.put(p)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(p,)) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        self.assert_not_dominated(store, plans)

    def test_processes_racing_converge_on_an_undominated_plan(self, store_spec: Any) -> None:
        if not self.supports_processes:
            pytest.skip("this store lives in one process")
        url, options = store_spec
        ctx = multiprocessing.get_context("spawn")
        args = [(url, options, seed, self.race_puts_each) for seed in range(self.race_processes)]
        with ctx.Pool(self.race_processes) as pool:
            results = pool.starmap_async(_race_worker, args).get(timeout=120)
        written = [make_plan(kv, base) for result in results for kv, base in result]
        store = open_store(url, **options)
        try:
            self.assert_not_dominated(store, written)
        finally:
            store.close()

    def test_processes_adding_incomparable_observations_lose_none(self, store_spec: Any) -> None:
        if not self.supports_processes:
            pytest.skip("this store lives in one process")
        url, options = store_spec
        ctx = multiprocessing.get_context("spawn")
        args = [(url, options, i) for i in range(self.race_processes)]
        with ctx.Pool(self.race_processes) as pool:
            results = pool.starmap_async(_staircase_worker, args).get(timeout=120)
        store = open_store(url, **options)
        try:
            final = store.get(make_plan().fingerprint)
        finally:
            store.close()
        assert final is not None
        stored = sorted(
            [o.kv_cache_memory_bytes, o.free_memory_baseline] for o in final.observations
        )
        assert stored == sorted(results)  # every node keeps exactly what it measured
