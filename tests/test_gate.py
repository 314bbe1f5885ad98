"""The OOM-safety gate and the dominance order."""

from __future__ import annotations

from typing import Any

import pytest

from plancache import applicable_kv_cache_memory_bytes
from plancache.merge import dominates
from plancache.testing import GiB, make_plan


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        (70 * GiB, 10 * GiB),
        (71 * GiB, 10 * GiB),
        (70 * GiB - 1, None),
        (0, None),
        (-1, None),
        (True, None),
        (70.0 * GiB, None),
        (None, None),
        ("80000000000", None),
    ],
)
def test_gate(free: Any, expected: int | None) -> None:
    assert applicable_kv_cache_memory_bytes(make_plan(), free) == expected


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
