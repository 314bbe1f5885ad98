"""The frontier merge: a join-semilattice within its bound, and the gate's choice on it."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from plancache._defaults import TOMBSTONE_SKEW_S
from plancache._gate import gate
from plancache._merge import covers, dominates, frontier, merge, merge_labels, retract, tombstones
from plancache._observation import MAX_CREATED_AT, Observation, Tombstone
from plancache._plan import MAX_OBSERVATIONS, MAX_TOMBSTONES, Plan
from plancache.errors import InvalidPlanError
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


# -- tombstones --------------------------------------------------------------------------------
def _record(
    points: list[Observation], dead: list[tuple[Observation, float]], now: float | None = None
) -> Plan:
    """A record of the frontier of ``points`` with tombstones for ``dead`` (observation,
    retraction time), merged at ``now`` so that it obeys every rule."""
    fp = make_fp()
    tombs = tombstones((Tombstone.of(o, t) for o, t in dead), now=now)
    gone = {t.observation for t in tombs}
    alive = frontier(o for o in points if o.digest not in gone)
    if not (alive or tombs):
        return Plan(fp, FACTORS, frontier(points[:1] or [Observation(1, 1, 0.0)]))
    return Plan(fp, FACTORS, alive, retracted=tombs)


def make_fp() -> str:
    return Plan.new(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=1).fingerprint


pool = st.lists(observations, min_size=1, max_size=8, unique_by=lambda o: o.digest)
times = st.sampled_from([10.0, 20.0, 30.0])
NOW = 1000.0
HORIZON = NOW + TOMBSTONE_SKEW_S
dated = st.sampled_from([10.0, 20.0, NOW + 3600.0, HORIZON + 1.0, MAX_CREATED_AT])
"""Retraction times up to year 9999, some past the skew bound of a node reading at ``NOW``."""


@st.composite
def records(
    draw: st.DrawFn,
    universe: list[Observation],
    when: st.SearchStrategy[float] = times,
    now: float | None = None,
) -> Plan:
    """Records of points of ``universe`` with tombstones retracted at ``when``, merged at
    ``now``: those that a node reading at ``NOW`` takes for valid."""
    points = draw(st.lists(st.sampled_from(universe), max_size=6))
    dead = draw(st.lists(st.tuples(st.sampled_from(universe), when), max_size=3))
    record = _record(points, dead, now)
    assume(record.observations or any(t.believable(NOW) for t in record.retracted))
    return record


@settings(max_examples=300, deadline=None)
@given(st.data(), pool)
def test_merge_with_tombstones_is_commutative_idempotent_and_never_resurrects(
    data: st.DataObject, universe: list[Observation]
) -> None:
    a, b, c = (data.draw(records(universe)) for _ in range(3))
    assert merge(a, b) == merge(b, a)
    assert merge(a, a) == a
    left, right = merge(merge(a, b), c), merge(a, merge(b, c))
    assert left.retracted == right.retracted  # the tombstones: associative
    for result in (left, right):
        dead = {t.observation for t in result.retracted}
        assert not any(o.digest in dead for o in result.observations)
        assert {t.observation for r in (a, b, c) for t in r.retracted} <= dead  # within bound
    named = {t.observation for t in left.retracted}
    union = [o for r in (a, b, c) for o in r.observations]
    if not any(o.digest in named and any(dominates(o, x) for x in union) for o in union):
        assert left == right  # associative unless a retracted point had dominated another


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 5)), max_size=120))
def test_tombstones_are_bounded_and_keep_the_latest_retractions(
    raw: list[tuple[int, int]],
) -> None:
    tombs = [Tombstone(f"{n:064x}", 1.0, float(t)) for n, t in raw]
    kept = tombstones(tombs)
    assert len(kept) <= MAX_TOMBSTONES
    assert [t.observation for t in kept] == sorted({t.observation for t in kept})
    latest: dict[str, float] = {}
    for t in tombs:
        latest[t.observation] = max(latest.get(t.observation, 0.0), t.retracted_at)
    assert len(kept) == min(MAX_TOMBSTONES, len(latest))
    assert all(latest[t.observation] == t.retracted_at for t in kept)
    if kept:
        floor = min(t.retracted_at for t in kept)
        assert all(r <= floor for d, r in latest.items() if d not in {t.observation for t in kept})
    assert tombstones(reversed(tombs)) == kept


# -- tombstones dated ahead: dropped past the skew bound, judged at one ``now`` ----------------


@settings(max_examples=300, deadline=None)
@given(st.data(), pool)
def test_the_merge_drops_tombstones_past_the_skew_bound_and_stays_a_semilattice(
    data: st.DataObject, universe: list[Observation]
) -> None:
    a, b, c = (data.draw(records(universe, dated, MAX_CREATED_AT)) for _ in range(3))

    def m(x: Plan, y: Plan) -> Plan:
        return merge(x, y, now=NOW)

    ab = m(a, b)
    assert ab == m(b, a)
    assert m(ab, ab) == ab and m(m(a, a), a) == m(a, a)  # idempotent on what it produces
    left, right = m(ab, c), m(a, m(b, c))
    assert left.retracted == right.retracted
    named = {t.observation for t in left.retracted}
    union = [o for r in (a, b, c) for o in r.observations]
    if not any(o.digest in named and any(dominates(o, x) for x in union) for o in union):
        assert left == right
    kept = {t.observation for r in (a, b, c) for t in r.retracted if t.retracted_at <= HORIZON}
    assert named == kept  # every tombstone within the bound (fewer than 32 here), no other
    for result in (ab, left, right):
        assert all(t.retracted_at <= HORIZON for t in result.retracted)
        dead = {t.observation for t in result.retracted}
        assert not any(o.digest in dead for o in result.observations)
    later = merge(merge(a, b, now=MAX_CREATED_AT), c, now=MAX_CREATED_AT)
    assert named <= {t.observation for t in later.retracted}  # a later clock admits more


def test_tombstones_dated_past_the_skew_bound_are_dropped_not_ranked() -> None:
    near = [Tombstone(f"{n:064x}", 1.0, NOW - n) for n in range(4)]
    far = [Tombstone(f"{n + 100:064x}", 1.0, MAX_CREATED_AT) for n in range(MAX_TOMBSTONES)]
    edge = Tombstone(f"{200:064x}", 1.0, HORIZON)
    assert tombstones([*near, *far, edge], now=NOW) == (*near, edge)
    assert tombstones(far, now=MAX_CREATED_AT) == tuple(far)


@pytest.mark.parametrize("ahead", [MAX_CREATED_AT - NOW, 3600.0])
def test_a_retraction_keeps_its_tombstone_past_others_that_rank_higher(ahead: float) -> None:
    good, bad = Observation(GiB, 2 * GiB, 1.0), Observation(5 * GiB, 9 * GiB, 1.0)
    others = tuple(Tombstone(f"{n:064x}", 1.0, NOW + ahead) for n in range(MAX_TOMBSTONES))
    plan = Plan(make_fp(), FACTORS, (good, bad), retracted=others)
    after = retract(plan, bad, NOW, now=NOW)
    assert after.observations == (good,)
    assert Tombstone.of(bad, NOW) in after.retracted
    assert len(after.retracted) == (1 if ahead > TOMBSTONE_SKEW_S else MAX_TOMBSTONES)
    stale = Plan(make_fp(), FACTORS, (good, bad))  # a copy from before: cannot undo it
    assert merge(after, stale, now=NOW) == merge(stale, after, now=NOW) == after


def test_a_record_of_tombstones_dated_past_the_skew_bound_only_holds_nothing() -> None:
    tombs = (Tombstone(f"{1:064x}", 1.0, HORIZON + 1.0), Tombstone(f"{2:064x}", 1.0, HORIZON))
    data = Plan(make_fp(), FACTORS, (), retracted=tombs[:1]).encode()
    with pytest.raises(InvalidPlanError, match="only tombstones dated more than"):
        Plan.decode(data, now=NOW)
    assert Plan.decode(data, now=NOW + 1.0).retracted == tombs[:1]  # within the bound by then
    both = Plan(make_fp(), FACTORS, (), retracted=tombs)
    assert Plan.decode(both.encode(), now=NOW) == both  # one believable tombstone: valid


def test_a_stale_copy_merged_later_does_not_bring_a_retracted_point_back() -> None:
    good, bad = Observation(GiB, 2 * GiB, 1.0), Observation(5 * GiB, 9 * GiB, 1.0)
    stale = Plan(make_fp(), FACTORS, frontier([good, bad]))
    retracted = retract(stale, bad, 100.0)
    assert retracted.observations == (good,)
    assert merge(retracted, stale) == merge(stale, retracted) == retracted
    only_bad = retract(Plan(make_fp(), FACTORS, (bad,)), bad, 100.0)
    assert only_bad.observations == () and len(only_bad.retracted) == 1
    assert merge(Plan(make_fp(), FACTORS, (bad,)), only_bad) == only_bad
    assert Plan.decode(only_bad.encode()) == only_bad
