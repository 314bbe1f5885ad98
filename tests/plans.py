"""Plan factories shared by the tests."""

from __future__ import annotations

from plancache.plan import Plan, Scalar

GiB = 1 << 30
FACTORS: dict[str, Scalar] = {"model": "test/model", "gpu_memory_utilization": 0.9, "rank": 0}


def make_plan(
    kv: int = 10 * GiB, baseline: int = 70 * GiB, factors: dict[str, Scalar] | None = None
) -> Plan:
    """A valid plan for ``factors`` (default ``FACTORS``)."""
    return Plan.new(
        FACTORS if factors is None else factors,
        kv_cache_memory_bytes=kv,
        free_memory_baseline=baseline,
        producer={"host": "test"},
    )
