"""Plans and sizes for tests of plancache and of third-party stores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plancache.fingerprint import Scalar
from plancache.plan import Plan

GiB = 1 << 30
FACTORS: dict[str, Scalar] = {"model": "test/model", "gpu_memory_utilization": 0.9, "rank": 0}
"""Factors of the default test plan."""


def make_plan(
    kv: int = 10 * GiB,
    baseline: int = 70 * GiB,
    factors: Mapping[str, Scalar] | None = None,
    *,
    producer: Mapping[str, Any] | None = None,
    created_at: float | None = None,
) -> Plan:
    """A valid plan for ``factors`` (default ``FACTORS``), produced by host ``test``."""
    return Plan.new(
        FACTORS if factors is None else factors,
        kv_cache_memory_bytes=kv,
        free_memory_baseline=baseline,
        producer={"host": "test"} if producer is None else producer,
        created_at=created_at,
    )
