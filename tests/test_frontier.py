"""The frontier merge: a join-semilattice within its bound, and the gate's choice on it."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancache.gate import gate
from plancache.merge import covers, dominates, frontier, merge, merge_labels
from plancache.plan import MAX_OBSERVATIONS, Observation, Plan
from plancache.testing import FACTORS, GiB

MiB = 1 << 20

observations = st.builds(
    lambda kv, extra, t, host: Observation(kv, kv + extra, t, {"host": host}),
    st.integers(1, 64).map(lambda n: n * 256 * MiB),
    st.integers(0, 64).map(lambda n: n * 256 * MiB),
    st.sampled_from([1.0, 2.0, 3.0]),
    st.sampled_from(["a", "b"]),
)
small_sets = st.lists(observations, max_size=6)
any_sets = st.lists(observations, max_size=80)


def _plan(points: list[Observation]) -> Plan:
    return Plan(
        Plan.new(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=1).fingerprint,
        FACTORS,
        frontier(points),
    )


@settings(max_examples=300, deadline=None)
@given(small_sets, small_sets, small_sets)
def test_merge_is_commutative_associative_and_idempotent(
    a: list[Observation], b: list[Observation], c: list[Observation]
) -> None:
    fa, fb, fc = frontier(a), frontier(b), frontier(c)
    assert frontier((*fa, *fb)) == frontier((*fb, *fa))
    assert frontier((*frontier((*fa, *fb)), *fc)) == frontier((*fa, *frontier((*fb, *fc))))
    assert frontier((*fa, *fa)) == fa
    assert frontier(fa) == fa


@settings(max_examples=300, deadline=None)
@given(any_sets)
def test_frontier_is_bounded_sorted_and_keeps_the_extremes(points: list[Observation]) -> None:
    f = frontier(points)
    assert len(f) <= MAX_OBSERVATIONS
    for low, high in itertools.pairwise(f):
        assert low.free_memory_baseline < high.free_memory_baseline
        assert low.kv_cache_memory_bytes < high.kv_cache_memory_bytes
    assert all(not dominates(x, y) for x in f for y in f)
    if points:
        assert f[0].free_memory_baseline == min(o.free_memory_baseline for o in points)
        assert f[-1].kv_cache_memory_bytes == max(o.kv_cache_memory_bytes for o in points)
        assert set(f) <= set(points)
        if len(f) < MAX_OBSERVATIONS:
            assert all(covers(f, o) for o in points)  # nothing lost within the bound
    assert frontier(reversed(points)) == f  # a function of the set, not of the order


@settings(max_examples=300, deadline=None)
@given(st.lists(observations, min_size=1, max_size=40), st.integers(1, 40).map(lambda n: n * GiB))
def test_lookup_applies_the_best_applicable_observation(
    points: list[Observation], free: int
) -> None:
    plan = _plan(points)
    chosen, reason = gate(plan, free)
    applicable = [o for o in plan.observations if o.free_memory_baseline <= free]
    if not applicable:
        assert chosen is None and reason == "gate:free-memory-below-baseline"
    else:
        assert chosen is not None and reason == "hit"
        assert chosen.free_memory_baseline <= free
        assert chosen.kv_cache_memory_bytes == max(o.kv_cache_memory_bytes for o in applicable)


def test_the_bound_drops_the_point_that_gives_up_least_capacity() -> None:
    staircase = [Observation((i + 1) * GiB, (40 + i) * GiB, 0.0) for i in range(MAX_OBSERVATIONS)]
    nearly_equal = Observation(
        staircase[10].kv_cache_memory_bytes + MiB, staircase[10].free_memory_baseline + MiB, 0.0
    )
    f = frontier([*staircase, nearly_equal])
    assert len(f) == MAX_OBSERVATIONS
    assert nearly_equal not in f and set(staircase) == set(f)


def test_equal_points_keep_one_chosen_by_encoding() -> None:
    a = Observation(GiB, 2 * GiB, 1.0, {"host": "a"})
    b = Observation(GiB, 2 * GiB, 2.0, {"host": "b"})
    assert frontier([a, b]) == frontier([b, a]) == (a,)


def test_merge_keeps_labels_deterministically_and_rejects_other_keys() -> None:
    assert merge_labels({"m": "x", "tp": 2}, {"m": "a"}) == merge_labels(
        {"m": "a"}, {"m": "x", "tp": 2}
    )
    assert merge_labels({"m": "x"}, {"m": "a"})["m"] == "a"
    p = Plan.new(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=2 * GiB)
    q = Plan.new({"other": 1}, kv_cache_memory_bytes=GiB, free_memory_baseline=2 * GiB)
    with pytest.raises(ValueError, match="different"):
        merge(p, q)


def test_a_shuffled_fleet_converges_on_one_frontier() -> None:
    rng = random.Random(3)
    points = [
        Observation(
            rng.randint(8, 12) * GiB + rng.randint(-64, 64) * MiB,
            rng.randint(60, 64) * GiB,
            float(i),
        )
        for i in range(64)
    ]
    plans = [
        Plan.new(
            FACTORS,
            kv_cache_memory_bytes=o.kv_cache_memory_bytes,
            free_memory_baseline=o.free_memory_baseline,
            created_at=o.created_at,
        )
        for o in points
    ]
    results = set()
    for _ in range(5):
        rng.shuffle(plans)
        acc = plans[0]
        for p in plans[1:]:
            acc = merge(acc, p)
        results.add(acc.encode())
    assert len(results) == 1
