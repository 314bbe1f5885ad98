"""The merge order: which observation makes which redundant when writers merge."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plancache._merge import at_least_as_good, covers, dominates, frontier
from plancache._observation import Observation
from plancache.testing import GiB


def point(kv: int, baseline: int) -> Observation:
    return Observation(kv * GiB, baseline * GiB, 0.0)


def test_dominance_is_a_strict_partial_order() -> None:
    base, more_kv, lower_baseline = point(10, 70), point(11, 70), point(10, 60)
    both, incomparable = point(11, 60), point(12, 75)
    assert dominates(more_kv, base) and dominates(lower_baseline, base)
    assert dominates(both, more_kv) and dominates(both, lower_baseline)
    assert not dominates(base, base)
    assert not dominates(base, more_kv)
    assert not dominates(incomparable, base) and not dominates(base, incomparable)


points = st.builds(point, st.integers(1, 8), st.integers(8, 16))


@given(points, points, points)
def test_dominance_is_irreflexive_asymmetric_and_transitive(
    a: Observation, b: Observation, c: Observation
) -> None:
    assert not dominates(a, a)
    assert not (dominates(a, b) and dominates(b, a))
    if dominates(a, b) and dominates(b, c):
        assert dominates(a, c)


@given(points, points)
def test_dominance_and_cover_are_the_one_order(a: Observation, b: Observation) -> None:
    same_point = (a.kv_cache_memory_bytes, a.free_memory_baseline) == (
        b.kv_cache_memory_bytes,
        b.free_memory_baseline,
    )
    assert covers([a], b) == at_least_as_good(a, b)
    assert dominates(a, b) == (at_least_as_good(a, b) and not same_point)
    assert (b in frontier([a, b])) == (not dominates(a, b))
