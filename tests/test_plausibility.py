"""The plausibility gate: a KV size beyond requested memory minus the weights never applies."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancache import PlanCache
from plancache._backends.local import LocalStore
from plancache._backends.tiered import TieredStore
from plancache._gate import Budget, gate, implausible
from plancache._merge import frontier, merge
from plancache._observation import Observation
from plancache._plan import Plan
from plancache._store import PlanStore
from plancache.testing import FACTORS, GiB, make_plan

MiB = 1 << 20
sizes = st.integers(1, 2**40)


def _frontier_plan(points: list[tuple[int, int]]) -> Plan:
    """A record whose frontier is ``points`` (kv GiB, baseline GiB)."""
    obs = [Observation(kv * GiB, base * GiB, 1.0) for kv, base in points]
    return Plan(make_plan().fingerprint, FACTORS, frontier(obs))


@settings(max_examples=300, deadline=None)
@given(kv=sizes, weights=st.integers(0, 2**40), slack=st.integers(0, 2**20))
def test_exactly_at_the_bound_applies_one_byte_over_does_not(
    kv: int, weights: int, slack: int
) -> None:
    plan = make_plan(kv=kv, baseline=kv + slack)
    free = kv + slack
    at = Budget(requested_memory=weights + kv, weights_memory=weights)
    assert gate(plan, free, at) == (plan.observations[0], "hit")
    over = Budget(requested_memory=weights + kv - 1, weights_memory=weights)
    if weights + kv - 1 > 0:
        assert gate(plan, free, over) == (None, "gate:exceeds-budget")


@settings(max_examples=200, deadline=None)
@given(requested=sizes, extra=st.integers(0, 2**40))
def test_weights_at_or_above_the_request_leave_nothing(requested: int, extra: int) -> None:
    plan = make_plan(kv=1, baseline=1)
    budget = Budget(requested_memory=requested, weights_memory=requested + extra)
    assert gate(plan, 10, budget) == (None, "gate:exceeds-budget")


@pytest.mark.parametrize(
    ("requested", "weights"),
    [(None, None), (None, 5 * GiB), (80 * GiB, None)],
)
def test_missing_figures_mean_no_plausibility_check(requested: Any, weights: Any) -> None:
    plan = make_plan(kv=60 * GiB, baseline=70 * GiB)
    assert gate(plan, 80 * GiB, Budget(requested, weights))[1] == "hit"


@pytest.mark.parametrize(
    ("requested", "weights"),
    [
        (True, 0),
        (80 * GiB, False),
        (-1, 0),
        (0, 0),
        (80 * GiB, -1),
        (80.0 * GiB, 0),
        ("80", 0),
        (80 * GiB, 1.5),
    ],
)
def test_malformed_figures_are_doubt_and_apply_nothing(requested: Any, weights: Any) -> None:
    plan = make_plan(kv=1 * GiB, baseline=70 * GiB)
    assert gate(plan, 80 * GiB, Budget(requested, weights)) == (None, "gate:budget-unknown")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=20),
    st.integers(1, 80),
    st.integers(1, 80),
)
def test_falls_back_to_the_largest_point_passing_both_rules(
    raw: list[tuple[int, int]], free_gib: int, limit_gib: int
) -> None:
    plan = _frontier_plan([(kv, kv + extra) for kv, extra in raw])
    free, limit = free_gib * GiB, limit_gib * GiB
    chosen, reason = gate(plan, free, Budget(limit + 3 * GiB, 3 * GiB))
    by_free = [o for o in plan.observations if o.free_memory_baseline <= free]
    both = [o for o in by_free if o.kv_cache_memory_bytes <= limit]
    if not by_free:
        assert (chosen, reason) == (None, "gate:free-memory-below-baseline")
    elif not both:
        assert (chosen, reason) == (None, "gate:exceeds-budget")
    else:
        assert reason == "hit" and chosen == max(both, key=lambda o: o.kv_cache_memory_bytes)


def test_poisoned_record_whose_kv_equals_its_baseline_is_never_applied(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = PlanStore(LocalStore(tmp_path))
    store.put(make_plan(kv=70 * GiB, baseline=70 * GiB))
    budget = Budget(requested_memory=72 * GiB, weights_memory=16 * GiB)
    with caplog.at_level(logging.INFO, logger="plancache"):
        d = PlanCache(store).lookup(FACTORS, 80 * GiB, budget=budget)
    assert (d.kv_cache_memory_bytes, d.reason) == (None, "gate:exceeds-budget")
    assert str(70 * GiB) in d.detail and str(72 * GiB) in d.detail and str(16 * GiB) in d.detail
    record = next(r for r in caplog.records if "exceeds-budget" in r.getMessage())
    assert record.levelno == logging.WARNING and str(56 * GiB) in record.getMessage()


def test_lookup_keeps_its_positional_shape_and_falls_back_within_a_record(
    tmp_path: Any,
) -> None:
    store = PlanStore(LocalStore(tmp_path))
    store.put(make_plan(kv=40 * GiB, baseline=60 * GiB))
    store.put(make_plan(kv=70 * GiB, baseline=70 * GiB))  # the poisoned point
    cache = PlanCache(store)
    assert cache.lookup(FACTORS, 80 * GiB).kv_cache_memory_bytes == 70 * GiB
    d = cache.lookup(FACTORS, current_free_memory=80 * GiB, budget=Budget(72 * GiB, 16 * GiB))
    assert (d.kv_cache_memory_bytes, d.reason) == (40 * GiB, "hit")


def test_tiered_store_looks_in_the_remote_when_the_local_record_is_implausible(
    tmp_path: Any,
) -> None:
    remote, local = (
        PlanStore(LocalStore(tmp_path / "remote")),
        PlanStore(LocalStore(tmp_path / "local")),
    )
    local.put(make_plan(kv=70 * GiB, baseline=70 * GiB))
    remote.put(make_plan(kv=40 * GiB, baseline=60 * GiB))
    cache = PlanCache(TieredStore(remote, local=local))
    d = cache.lookup(FACTORS, 80 * GiB, budget=Budget(72 * GiB, 16 * GiB))
    assert (d.kv_cache_memory_bytes, d.reason) == (40 * GiB, "hit")


def test_implausible_lists_what_no_boot_of_the_key_could_allocate() -> None:
    plan = merge(make_plan(10 * GiB, 60 * GiB), make_plan(40 * GiB, 70 * GiB))
    assert implausible(plan, Budget(50 * GiB, 20 * GiB)) == [plan.observations[1]]
    assert implausible(plan, Budget(80 * GiB, 20 * GiB)) == []
    assert implausible(plan, Budget(None, 20 * GiB)) == []  # unknown: nothing judged
    assert implausible(plan, Budget(True, 20 * GiB)) == []  # malformed: nothing judged
    assert implausible(plan, None) == []
