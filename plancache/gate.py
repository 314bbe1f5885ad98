"""The OOM-safety gate and the dominance order between plans (pure)."""

from __future__ import annotations

from plancache.plan import Plan

PASSED = "hit"
BELOW_BASELINE = "gate:free-memory-below-baseline"
UNKNOWN = "gate:free-memory-unknown"


def gate(plan: Plan, current_free_memory: object) -> tuple[int | None, str]:
    """(KV-cache bytes to apply or None, reason). A plan applies only if the device has at
    least as much free memory now as when the plan was recorded; any doubt (non-int,
    non-positive or bool free memory) means None with reason ``gate:free-memory-unknown``."""
    if type(current_free_memory) is not int or current_free_memory <= 0:
        return None, UNKNOWN
    if current_free_memory < plan.free_memory_baseline:
        return None, BELOW_BASELINE
    return plan.kv_cache_memory_bytes, PASSED


def applicable_kv_cache_memory_bytes(plan: Plan, current_free_memory: object) -> int | None:
    """The KV-cache bytes to apply, or None when the plan must not be applied (see ``gate``)."""
    return gate(plan, current_free_memory)[0]


def dominates(new: Plan, old: Plan) -> bool:
    """True if ``new`` should replace ``old``: same key, at least as much KV cache, a baseline
    no higher (applies on at least as many nodes), and strictly better in one of the two."""
    if new.fingerprint != old.fingerprint:
        return False
    kv_ge = new.kv_cache_memory_bytes >= old.kv_cache_memory_bytes
    base_le = new.free_memory_baseline <= old.free_memory_baseline
    strict = (
        new.kv_cache_memory_bytes > old.kv_cache_memory_bytes
        or new.free_memory_baseline < old.free_memory_baseline
    )
    return kv_ge and base_le and strict
