"""Provisional observations: what a boot that compiled during profiling measured (its compile
temporaries counted as activation memory, vLLM #54122) is a second frontier, applied only by
boots that compile too, and never drops a warm observation."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancache import PlanCache, open_store
from plancache._gate import gate
from plancache._merge import covers, frontier, merge, retract
from plancache._observation import Observation
from plancache._plan import MAX_PROVISIONAL, Plan
from plancache._reasons import PutOutcome, Reason
from plancache.errors import InvalidPlanError
from plancache.testing import FACTORS, GiB

MiB = 1 << 20
FP = Plan.new(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=1).fingerprint

observations = st.builds(
    lambda kv, extra, host: Observation(kv, kv + extra, 1.0, {"host": host}),
    st.integers(1, 32).map(lambda n: n * 512 * MiB),
    st.integers(0, 32).map(lambda n: n * 512 * MiB),
    st.sampled_from(["a", "b"]),
)


def _record(warm: list[Observation], provisional: list[Observation]) -> Plan:
    """A record as merges build it: the provisional points a warm one covers dropped."""
    w = frontier(warm)
    p = frontier([o for o in provisional if not covers(w, o)], MAX_PROVISIONAL)
    return Plan(FP, FACTORS, w, provisional=p)


records = st.builds(
    _record,
    st.lists(observations, min_size=1, max_size=4),
    st.lists(observations, max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(records, records, records)
def test_the_merge_stays_a_semilattice_and_provisional_points_never_drop_warm_ones(
    a: Plan, b: Plan, c: Plan
) -> None:
    assert merge(a, b) == merge(b, a)
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a
    both = merge(a, b)
    assert both.observations == frontier((*a.observations, *b.observations))
    assert not any(covers(both.observations, o) for o in both.provisional)
    # nothing lost: each provisional point is covered by one of either frontier
    held = (*both.observations, *both.provisional)
    assert all(covers(held, o) for o in (*a.provisional, *b.provisional))


def test_a_warm_observation_as_good_replaces_the_provisional_one() -> None:
    cold = Plan.new(
        FACTORS, kv_cache_memory_bytes=50 * GiB, free_memory_baseline=70 * GiB, provisional=True
    )
    warm = Plan.new(FACTORS, kv_cache_memory_bytes=56 * GiB, free_memory_baseline=70 * GiB)
    assert (cold.observations, len(cold.provisional)) == ((), 1)
    merged = merge(cold, warm)
    assert merged.observations == warm.observations and merged.provisional == ()
    # a provisional point a warm one does not cover stays beside it; it drops no warm one
    richer = Plan.new(
        FACTORS, kv_cache_memory_bytes=60 * GiB, free_memory_baseline=65 * GiB, provisional=True
    )
    kept = merge(merged, richer)
    assert kept.observations == warm.observations
    assert kept.provisional == richer.provisional


@pytest.mark.parametrize(
    ("compiles", "expected"),
    [
        (True, (60 * GiB, Reason.HIT)),  # the largest of both frontiers
        (False, (56 * GiB, Reason.HIT)),  # warm ones only
        (None, (56 * GiB, Reason.HIT)),  # not known: warm ones only
    ],
)
def test_provisional_points_apply_only_to_boots_that_compile(
    compiles: bool | None, expected: tuple[int, Reason]
) -> None:
    plan = merge(
        Plan.new(FACTORS, kv_cache_memory_bytes=56 * GiB, free_memory_baseline=70 * GiB),
        Plan.new(
            FACTORS, kv_cache_memory_bytes=60 * GiB, free_memory_baseline=65 * GiB, provisional=True
        ),
    )
    chosen, reason = gate(plan, 72 * GiB, compiles=compiles)
    assert (None if chosen is None else chosen.kv_cache_memory_bytes, reason) == expected


def test_a_boot_not_known_to_compile_profiles_where_only_a_provisional_point_fits() -> None:
    cold = Plan.new(
        FACTORS, kv_cache_memory_bytes=50 * GiB, free_memory_baseline=70 * GiB, provisional=True
    )
    for compiles in (False, None):
        assert gate(cold, 72 * GiB, compiles=compiles) == (None, Reason.PROVISIONAL)
        # where no point would fit anyway, the reason names the rule, not provisionality
        assert gate(cold, 69 * GiB, compiles=compiles) == (None, Reason.BELOW_BASELINE)
    assert gate(cold, 72 * GiB, compiles=True) == (cold.provisional[0], Reason.HIT)
    # a warm point that does not fit while a provisional one would: provisional
    plan = merge(
        cold, Plan.new(FACTORS, kv_cache_memory_bytes=56 * GiB, free_memory_baseline=75 * GiB)
    )
    assert gate(plan, 72 * GiB) == (None, Reason.PROVISIONAL)
    assert gate(plan, 76 * GiB) == (plan.observations[0], Reason.HIT)


def test_encoding_round_trips_and_a_record_without_them_encodes_as_before() -> None:
    warm = Plan.new(
        FACTORS, kv_cache_memory_bytes=56 * GiB, free_memory_baseline=75 * GiB, created_at=1.0
    )
    assert b"provisional" not in warm.encode()  # older readers' bytes, digests, signatures
    cold = Plan.new(
        FACTORS,
        kv_cache_memory_bytes=50 * GiB,
        free_memory_baseline=70 * GiB,
        created_at=2.0,
        provisional=True,
    )
    both = merge(warm, cold)
    assert Plan.decode(both.encode()) == both and Plan.decode(cold.encode()) == cold
    body = orjson.loads(both.encode())
    assert len(body["observations"]) == len(body["provisional"]) == 1
    # a reader that ignores the field (as every unknown top-level field) sees the warm record
    del body["provisional"]
    assert Plan.decode(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)) == warm
    assert both.newest == cold.provisional[0]


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.update(provisional={}),
        lambda b: b.update(provisional=[b["provisional"][0]] * 2),  # not a frontier
        lambda b: b.update(provisional=[{"kv_cache_memory_bytes": 1}]),
        lambda b: b.update(provisional=b["provisional"] * (MAX_PROVISIONAL + 1)),
    ],
)
def test_malformed_provisional_points_make_the_record_invalid(change: object) -> None:
    body = orjson.loads(
        Plan.new(
            FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=2 * GiB, provisional=True
        ).encode()
    )
    change(body)  # type: ignore[operator]
    with pytest.raises(InvalidPlanError):
        Plan.decode(orjson.dumps(body))


def test_a_retraction_removes_a_provisional_point_for_good() -> None:
    cold = Plan.new(
        FACTORS, kv_cache_memory_bytes=50 * GiB, free_memory_baseline=70 * GiB, provisional=True
    )
    (point,) = cold.provisional
    gone = retract(cold, point, 5.0)
    assert gone.provisional == () and gone.observations == ()
    assert merge(gone, cold).provisional == ()  # an older copy does not bring it back


def test_the_cache_records_provisionally_and_a_warm_profile_takes_over(tmp_path: object) -> None:
    cache = PlanCache(open_store(str(tmp_path)), timeout=5.0)
    cold = cache.record(
        FACTORS, kv_cache_memory_bytes=50 * GiB, free_memory_baseline=70 * GiB, provisional=True
    )
    assert cold.outcome is PutOutcome.CREATED
    again = cache.record(
        FACTORS, kv_cache_memory_bytes=49 * GiB, free_memory_baseline=71 * GiB, provisional=True
    )
    assert again.outcome is PutOutcome.KEPT  # covered: nothing written
    assert cache.lookup(FACTORS, 72 * GiB).reason == Reason.PROVISIONAL
    assert cache.lookup(FACTORS, 72 * GiB, compiles=True).kv_cache_memory_bytes == 50 * GiB
    warm = cache.record(FACTORS, kv_cache_memory_bytes=56 * GiB, free_memory_baseline=70 * GiB)
    assert warm.outcome is PutOutcome.REPLACED
    for compiles in (None, False, True):
        d = cache.lookup(FACTORS, 72 * GiB, compiles=compiles)
        assert (d.reason, d.kv_cache_memory_bytes) == (Reason.HIT, 56 * GiB)
    stored = cache.store.get(cold.fingerprint or "")
    assert stored is not None and stored.provisional == ()  # the warm point covers it
