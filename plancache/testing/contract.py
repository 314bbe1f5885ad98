"""The store contract as pytest base classes: subclass one in your own tests and every
contract test runs against your store, races across 16 threads and 16 processes included.

``StoreContract`` asks a subclass for two fixtures (and tells, in class attributes, how many
threads, processes and writers its races use):

- ``store_spec``: ``(url, storage_options)`` of a fresh, empty store that ``open_store``
  opens; or, for a store no URL names, ``store_factory``: a picklable callable with no
  arguments that opens it (``functools.partial(MyLayer, path)``: an ``ObjectLayer``, on
  which the contract builds the plans kind, or a ``PlanStore``). The process race calls
  the factory in child processes (``spawn``), so it must reopen *the same* store there.
- ``write_raw``: a callable ``(fingerprint, data)`` that stores ``data`` verbatim as the
  record of ``fingerprint`` in that store, past the store's own checks. The contract writes
  torn, oversized and foreign records with it and checks how the store reads them.

``ObjectStoreContract`` (``plancache.testing.object_contract``) adds what an object store
behind HTTP promises (one request per read and per create, objects that standard tools read,
listings that page); see its docstring.

A fixture a subclass forgot fails every test that needs it with a message that names it.
``race(fn, args)`` runs the thread race's calls; a backend's own race tests may use it too.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, ClassVar, TypeVar

import orjson
import pytest

from plancache import InvalidPlanError, Plan, PlanStore, PutOutcome, open_store
from plancache._merge import covers, frontier
from plancache._objects import CREATE, Create, ObjectLayer, WriteMode
from plancache._plan import MAX_OBSERVATIONS, MAX_RECORD_BYTES
from plancache._units import GiB
from plancache.errors import UnsupportedSchemaError
from plancache.testing.plans import make_plan

T = TypeVar("T")
StoreSpec = tuple[str, dict[str, Any]]
"""``(url, storage_options)``: what ``open_store`` takes."""
StoreFactory = Callable[[], ObjectLayer | PlanStore]
WriteRaw = Callable[[str, bytes], None]

BAD_KEYS: list[object] = [
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


def missing_fixture(
    owner: object, name: str, what: str, *, see: str = __name__
) -> NotImplementedError:
    """The error a contract fixture raises when the subclass ``owner`` did not provide it;
    ``see``: the module that documents the fixture."""
    return NotImplementedError(
        f"{type(owner).__name__} must provide the {name!r} fixture: {what} (see {see})"
    )


def race(fn: Callable[[T], object], args: Sequence[T], timeout: float = 60) -> list[BaseException]:
    """Call ``fn(arg)`` for every one of ``args``, each in its own thread, all let go at once;
    wait up to ``timeout`` seconds for each thread; return what the calls raised."""
    barrier = threading.Barrier(len(args))
    errors: list[BaseException] = []

    def call(arg: T) -> None:
        barrier.wait()
        try:
            fn(arg)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return errors


def plans(made: ObjectLayer | PlanStore) -> PlanStore:
    """What a store factory made, as the plans kind: a layer gets the plans kind built on it
    (as ``open_store`` does); a ``PlanStore`` is used as it is."""
    return made if isinstance(made, PlanStore) else PlanStore(made)


def _delete_any(store: PlanStore, fp: str) -> bool:
    return store.delete_if(fp, lambda raw: True)


def _count_creates(store: PlanStore) -> Counter[int]:
    """Count the creates ``store`` sends to its layer from now on, per thread."""
    count: Counter[int] = Counter()
    write = store.layer.write_object

    def counted(name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        if isinstance(mode, Create):
            count[threading.get_ident()] += 1
        return write(name, chunks, mode)

    store.layer.write_object = counted  # type: ignore[method-assign]
    return count


def _race_worker(open_store_: StoreFactory, seed: int, count: int) -> list[list[int]]:
    """Put ``count`` random plans for ``FACTORS``; return the (kv, baseline) pairs written."""
    store = plans(open_store_())
    rng = random.Random(seed)
    written = []
    for _ in range(count):
        baseline = rng.randint(40, 80) * GiB
        kv = rng.randint(1, 40) * GiB
        store.put(make_plan(kv, baseline))
        written.append([kv, baseline])
    store.close()
    return written


def _staircase_worker(open_store_: StoreFactory, index: int) -> list[int]:
    """Put one observation no other worker's dominates (baseline and KV grow with
    ``index``); return the (kv, baseline) written."""
    store = plans(open_store_())
    kv, baseline = (1 + index) * GiB, (40 + index) * GiB
    store.put(make_plan(kv, baseline))
    store.close()
    return [kv, baseline]


class StoreContract:
    """Every store contract test, run against the store the subclass's fixtures name.

    A backend is done when it passes all of it.
    """

    #: False for stores that live in one process only (``memory://``): skips the process race.
    supports_processes: ClassVar[bool] = True
    race_threads: ClassVar[int] = 16
    race_processes: ClassVar[int] = 16
    race_puts_each: ClassVar[int] = 3
    #: Threads racing on one key with points that all belong to the frontier (0: skip).
    contention_writers: ClassVar[int] = 32

    # ------------------------------------------------------------------ fixtures to provide

    @pytest.fixture
    def store_spec(self) -> StoreSpec:
        """``(url, storage_options)`` of a fresh, empty store."""
        raise missing_fixture(
            self,
            "store_spec",
            "(url, storage_options) of a fresh, empty store; or override 'store_factory' "
            "with a picklable callable that opens one",
        )

    @pytest.fixture
    def store_factory(self, store_spec: StoreSpec) -> StoreFactory:
        """A picklable callable that opens the store under test, here or in a child process
        (default: ``open_store`` on ``store_spec``)."""
        url, options = store_spec
        return partial(open_store, url, **options)

    @pytest.fixture
    def write_raw(self) -> WriteRaw:
        """A callable ``(fingerprint, data)`` writing ``data`` verbatim as that record."""
        raise missing_fixture(
            self,
            "write_raw",
            "a callable (fingerprint, data) that stores data verbatim as the record of "
            "fingerprint in the store under test, bypassing the store's own checks",
        )

    # ------------------------------------------------------------------ fixtures provided

    @pytest.fixture
    def store(self, store_factory: StoreFactory) -> Iterator[PlanStore]:
        """The store under test, closed after the test."""
        store = plans(store_factory())
        yield store
        store.close()

    def assert_frontier_of(self, store: PlanStore, written: list[Plan]) -> None:
        """The stored frontier is the frontier of every observation written: each point was
        written, and (within the bound) each observation is a point or dominated by one."""
        final = store.get(written[0].fingerprint)
        assert final is not None
        observations = [o for p in written for o in p.observations]
        points = {(o.kv_cache_memory_bytes, o.free_memory_baseline) for o in observations}
        for o in final.observations:
            assert (o.kv_cache_memory_bytes, o.free_memory_baseline) in points
        if len(final.observations) < MAX_OBSERVATIONS:
            lost = [o for o in observations if not covers(final.observations, o)]
            assert not lost, f"observations lost: {lost[:3]}"
        expected = [
            (o.kv_cache_memory_bytes, o.free_memory_baseline) for o in frontier(observations)
        ]
        assert [(o.kv_cache_memory_bytes, o.free_memory_baseline) for o in final.observations] == (
            expected
        )

    # ------------------------------------------------------------------ the contract

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
        self, store: PlanStore, write_raw: WriteRaw
    ) -> None:
        plan = make_plan()
        (o,) = plan.observations
        legacy = {"schema": 1, "fingerprint": plan.fingerprint, "factors": dict(plan.factors)}
        write_raw(plan.fingerprint, orjson.dumps(legacy | o.to_dict()))
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
    def test_invalid_record_is_reported_then_replaced(
        self, store: PlanStore, write_raw: WriteRaw, raw: bytes
    ) -> None:
        plan = make_plan()
        write_raw(plan.fingerprint, raw)
        with pytest.raises(InvalidPlanError):
            store.get(plan.fingerprint)
        assert store.put(plan) is PutOutcome.REPLACED
        assert store.get(plan.fingerprint) == plan

    def test_record_of_another_schema_version_is_never_overwritten(
        self, store: PlanStore, write_raw: WriteRaw
    ) -> None:
        plan = make_plan()
        newer = orjson.dumps({"schema": 3, "fingerprint": plan.fingerprint, "future": [1]})
        write_raw(plan.fingerprint, newer)
        with pytest.raises(UnsupportedSchemaError):
            store.get(plan.fingerprint)
        assert store.put(make_plan(kv=20 * GiB)) is PutOutcome.KEPT
        assert store.read_raw(plan.fingerprint) == newer

    def test_record_stored_under_another_key_is_invalid(
        self, store: PlanStore, write_raw: WriteRaw
    ) -> None:
        plan, other = make_plan(), make_plan(factors={"model": "other"})
        write_raw(other.fingerprint, plan.encode())
        with pytest.raises(InvalidPlanError, match="key"):
            store.get(other.fingerprint)

    def test_an_observation_the_frontier_covers_writes_nothing(self, store: PlanStore) -> None:
        plan = make_plan()
        store.put(plan)
        before = store.read_raw(plan.fingerprint)
        (o,) = plan.observations
        same_point = Plan.new(
            plan.factors,
            kv_cache_memory_bytes=o.kv_cache_memory_bytes,
            free_memory_baseline=o.free_memory_baseline,
            producer={"host": "another"},
            created_at=o.created_at - 1,
            labels={"model": "labelled"},
        )
        for covered in (same_point, make_plan(9 * GiB, 71 * GiB)):
            assert store.put(covered) is PutOutcome.KEPT
        assert store.read_raw(plan.fingerprint) == before

    def test_a_conditional_delete_keeps_what_was_written_after_the_judging_read(
        self, store: PlanStore, store_factory: StoreFactory
    ) -> None:
        plan, later = make_plan(), make_plan(kv=11 * GiB)
        store.put(plan)
        other = plans(store_factory())
        judged: list[bytes] = []

        def doomed(raw: bytes) -> bool:
            judged.append(raw)
            if len(judged) == 1:  # another writer lands between this read and the delete
                other.put(later)
            return raw == plan.encode()

        try:
            assert store.delete_if(plan.fingerprint, doomed) is False
        finally:
            other.close()
        assert judged[:2] == [plan.encode(), later.encode()]  # judged again, and kept
        assert store.get(plan.fingerprint) == later
        assert store.delete_if(plan.fingerprint, lambda raw: raw == later.encode()) is True
        assert store.get(plan.fingerprint) is None
        assert store.delete_if(plan.fingerprint, lambda raw: True) is True  # gone already

    def test_a_rewrite_that_deletes_keeps_what_was_written_after_its_read(
        self, store: PlanStore, store_factory: StoreFactory
    ) -> None:
        old, later = make_plan(), make_plan(12 * GiB, 75 * GiB)  # incomparable points
        store.put(old)
        other = plans(store_factory())
        seen: list[Plan] = []

        def forget_old(p: Plan) -> Plan | None:
            seen.append(p)
            if len(seen) == 1:  # another writer lands between this read and the delete
                other.put(later)
            return p.keeping(lambda o: o not in old.observations)

        try:
            assert store.rewrite(old.fingerprint, forget_old) == later
        finally:
            other.close()
        assert store.get(old.fingerprint) == later

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
        for call in (store.get, store.delete, store.read_raw, partial(_delete_any, store)):
            with pytest.raises(ValueError):
                call(key)

    def test_url_and_repr_name_the_store(self, store: PlanStore) -> None:
        assert isinstance(store.url, str) and store.url
        assert store.url in repr(store)

    def test_threads_racing_converge_on_an_undominated_plan(self, store: PlanStore) -> None:
        rng = random.Random(7)
        plans = [
            make_plan(rng.randint(1, 40) * GiB, rng.randint(40, 80) * GiB)
            for _ in range(self.race_threads)
        ]
        assert not race(store.put, plans)
        self.assert_frontier_of(store, plans)

    def test_writers_racing_on_one_key_lose_no_observation(self, store: PlanStore) -> None:
        """``contention_writers`` threads let go at once, each with a point no other's
        dominates: every point is stored, and no writer sends a second create (after one
        is refused, the record is known to exist)."""
        n = self.contention_writers
        if not n:
            pytest.skip("contention_writers is 0")
        assert n <= MAX_OBSERVATIONS  # every point fits the frontier: none may be dropped
        plans = [make_plan((1 + i) * GiB, (40 + i) * GiB) for i in range(n)]
        store.get(make_plan(factors={"model": "warm-up"}).fingerprint)  # the client is open
        creates = _count_creates(store)
        errors = race(lambda p: store.put(p), plans, timeout=120)
        assert not errors, errors
        final = store.get(plans[0].fingerprint)
        assert final is not None
        assert final.observations == tuple(o for p in plans for o in p.observations)
        assert max(creates.values(), default=0) <= 1

    def test_processes_racing_converge_on_an_undominated_plan(
        self, store_factory: StoreFactory
    ) -> None:
        if not self.supports_processes:
            pytest.skip("this store lives in one process")
        ctx = multiprocessing.get_context("spawn")
        n = self.race_processes
        args = [(store_factory, seed, self.race_puts_each) for seed in range(n)]
        with ctx.Pool(n) as pool:
            results = pool.starmap_async(_race_worker, args).get(timeout=120)
        written = [make_plan(kv, base) for result in results for kv, base in result]
        store = plans(store_factory())
        try:
            self.assert_frontier_of(store, written)
        finally:
            store.close()

    def test_processes_adding_incomparable_observations_lose_none(
        self, store_factory: StoreFactory
    ) -> None:
        if not self.supports_processes:
            pytest.skip("this store lives in one process")
        ctx = multiprocessing.get_context("spawn")
        args = [(store_factory, i) for i in range(self.race_processes)]
        with ctx.Pool(self.race_processes) as pool:
            results = pool.starmap_async(_staircase_worker, args).get(timeout=120)
        store = plans(store_factory())
        try:
            final = store.get(make_plan().fingerprint)
        finally:
            store.close()
        assert final is not None
        stored = [[o.kv_cache_memory_bytes, o.free_memory_baseline] for o in final.observations]
        assert sorted(stored) == sorted(results)  # every writer keeps exactly what it measured
