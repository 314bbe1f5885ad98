"""plancache: content-addressed vLLM startup plans, shared by a fleet through any store."""

from __future__ import annotations

__version__ = "0.1.0"

from plancache.backends import open_store
from plancache.cache import Decision, PlanCache, Recorded
from plancache.fingerprint import fingerprint
from plancache.gate import applicable_kv_cache_memory_bytes
from plancache.plan import InvalidPlanError, Plan
from plancache.store import PlanStore, PlanStoreError, PutOutcome

__all__ = [
    "Decision",
    "InvalidPlanError",
    "Plan",
    "PlanCache",
    "PlanStore",
    "PlanStoreError",
    "PutOutcome",
    "Recorded",
    "__version__",
    "applicable_kv_cache_memory_bytes",
    "fingerprint",
    "open_store",
]
