"""The merge order: which plan replaces which when writers merge."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plancache import Plan
from plancache.merge import dominates
from plancache.testing import GiB, make_plan


def test_dominance_is_a_strict_partial_order() -> None:
    base = make_plan()
    more_kv = make_plan(kv=11 * GiB)
    lower_baseline = make_plan(baseline=60 * GiB)
    both = make_plan(kv=11 * GiB, baseline=60 * GiB)
    incomparable = make_plan(kv=12 * GiB, baseline=75 * GiB)
    other_key = make_plan(kv=20 * GiB, baseline=30 * GiB, factors={"model": "x"})
    assert dominates(more_kv, base) and dominates(lower_baseline, base)
    assert dominates(both, more_kv) and dominates(both, lower_baseline)
    assert not dominates(base, base)
    assert not dominates(base, more_kv)
    assert not dominates(incomparable, base) and not dominates(base, incomparable)
    assert not dominates(other_key, base)


kvs = st.integers(min_value=1, max_value=8).map(lambda n: n * GiB)
baselines = st.integers(min_value=8, max_value=16).map(lambda n: n * GiB)
plans = st.builds(make_plan, kvs, baselines)


@given(plans, plans, plans)
def test_dominance_is_irreflexive_asymmetric_and_transitive(a: Plan, b: Plan, c: Plan) -> None:
    assert not dominates(a, a)
    assert not (dominates(a, b) and dominates(b, a))
    if dominates(a, b) and dominates(b, c):
        assert dominates(a, c)
