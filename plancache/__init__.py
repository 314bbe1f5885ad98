"""plancache: content-addressed vLLM startup plans, shared by a fleet through any store."""

from __future__ import annotations

__version__ = "0.2.0"

from plancache.backends import open_store
from plancache.cache import Decision, PlanCache, Recorded
from plancache.errors import (
    ConfigError,
    InvalidPlanError,
    InvalidSignatureError,
    MissingExtraError,
    PlanStoreConflict,
    PlanStoreConflictError,
    PlanStoreError,
    PlanStoreNotFound,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreReadOnlyError,
    PlanStoreUnavailable,
    PlanStoreUnavailableError,
    RankAgreementError,
    ReadOnlyStoreError,
    UnknownSchemeError,
    UnsupportedSchemaError,
    UnsupportedStoreError,
)
from plancache.fingerprint import fingerprint
from plancache.gate import applicable_kv_cache_memory_bytes
from plancache.plan import Plan
from plancache.reasons import Reason, RecordReason
from plancache.store import PlanStore, PutOutcome

__all__ = [
    "ConfigError",
    "Decision",
    "InvalidPlanError",
    "InvalidSignatureError",
    "MissingExtraError",
    "Plan",
    "PlanCache",
    "PlanStore",
    "PlanStoreConflict",
    "PlanStoreConflictError",
    "PlanStoreError",
    "PlanStoreNotFound",
    "PlanStoreNotFoundError",
    "PlanStorePermissionError",
    "PlanStoreReadOnlyError",
    "PlanStoreUnavailable",
    "PlanStoreUnavailableError",
    "PutOutcome",
    "RankAgreementError",
    "ReadOnlyStoreError",
    "Reason",
    "RecordReason",
    "Recorded",
    "UnknownSchemeError",
    "UnsupportedSchemaError",
    "UnsupportedStoreError",
    "__version__",
    "applicable_kv_cache_memory_bytes",
    "fingerprint",
    "open_store",
]
