"""The OOM-safety gate: whether a plan may be applied on this device now (pure)."""

from __future__ import annotations

from plancache.plan import Plan
from plancache.reasons import Reason


def gate(plan: Plan, current_free_memory: object) -> tuple[int | None, Reason]:
    """(KV-cache bytes to apply or None, reason). A plan applies only if the device has at
    least as much free memory now as when the plan was recorded; any doubt (non-int,
    non-positive or bool free memory) means None with reason ``gate:free-memory-unknown``."""
    if type(current_free_memory) is not int or current_free_memory <= 0:
        return None, Reason.FREE_MEMORY_UNKNOWN
    if current_free_memory < plan.free_memory_baseline:
        return None, Reason.BELOW_BASELINE
    return plan.kv_cache_memory_bytes, Reason.HIT


def applicable_kv_cache_memory_bytes(plan: Plan, current_free_memory: object) -> int | None:
    """The KV-cache bytes to apply, or None when the plan must not be applied (see ``gate``)."""
    return gate(plan, current_free_memory)[0]
