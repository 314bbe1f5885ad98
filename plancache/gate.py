"""The OOM-safety gate: which observation of a plan, if any, may be applied on this device
now (pure)."""

from __future__ import annotations

from plancache.plan import Observation, Plan
from plancache.reasons import Reason


def gate(plan: Plan, current_free_memory: object) -> tuple[Observation | None, Reason]:
    """(observation to apply or None, reason). An observation applies only if the device has
    at least as much free memory now as when it was recorded; of those, the one with the
    largest KV cache is chosen. Any doubt (non-int, non-positive or bool free memory) means
    None with reason ``gate:free-memory-unknown``."""
    if type(current_free_memory) is not int or current_free_memory <= 0:
        return None, Reason.FREE_MEMORY_UNKNOWN
    best: Observation | None = None
    for o in plan.observations:
        if o.free_memory_baseline <= current_free_memory and (
            best is None or o.kv_cache_memory_bytes > best.kv_cache_memory_bytes
        ):
            best = o
    if best is None:
        return None, Reason.BELOW_BASELINE
    return best, Reason.HIT


def applicable_kv_cache_memory_bytes(plan: Plan, current_free_memory: object) -> int | None:
    """The KV-cache bytes to apply, or None when no observation may be applied (``gate``)."""
    best, _ = gate(plan, current_free_memory)
    return None if best is None else best.kv_cache_memory_bytes
