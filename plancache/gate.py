"""The OOM-safety gate and the dominance order between plans (pure)."""

from __future__ import annotations

from plancache.plan import Plan


def applicable_kv_cache_memory_bytes(plan: Plan, current_free_memory: object) -> int | None:
    """The KV-cache bytes to apply, or None when the plan must not be applied.

    A plan applies only if the device has at least as much free memory now as when the plan
    was recorded. Any doubt (non-int or non-positive free memory, bool) means None.
    """
    if not isinstance(current_free_memory, int) or isinstance(current_free_memory, bool):
        return None
    if current_free_memory <= 0 or current_free_memory < plan.free_memory_baseline:
        return None
    return plan.kv_cache_memory_bytes


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
