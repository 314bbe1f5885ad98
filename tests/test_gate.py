"""The OOM-safety gate."""

from __future__ import annotations

from typing import Any

import pytest

from plancache import applicable_kv_cache_memory_bytes
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
