"""The order in which plans replace each other when writers merge (pure)."""

from __future__ import annotations

from plancache.plan import Plan


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
