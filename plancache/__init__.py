"""plancache: content-addressed vLLM startup plans, shared by a fleet through any store.

The public names load on first use (PEP 562), so ``import plancache`` stays cheap: the vLLM
plugin imports it in every process vLLM starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from plancache.errors import (
    ArtifactError,
    CliError,
    ConfigError,
    InvalidPlanError,
    InvalidSignatureError,
    JobTimeout,
    MissingExtraError,
    PlancacheError,
    PlanStoreConflictError,
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreReadOnlyError,
    PlanStoreUnavailableError,
    RankAgreementError,
    StoreIgnoresPreconditionsError,
    UnknownSchemeError,
    UnreadableHereError,
    UnsupportedSchemaError,
    UnsupportedStoreError,
    deprecated_alias,
)
from plancache.fingerprint import fingerprint  # bound now: the submodule shares its name
from plancache.reasons import deprecated_reason

__version__ = "0.3.0"

if TYPE_CHECKING:
    from plancache.backends import open_store
    from plancache.cache import Decision, PlanCache, Recorded
    from plancache.gate import Budget, applicable_kv_cache_memory_bytes
    from plancache.observation import Observation
    from plancache.plan import Plan
    from plancache.reasons import PutOutcome, Reason
    from plancache.store import PlanStore

_LAZY = {
    "open_store": "plancache.backends",
    "Decision": "plancache.cache",
    "PlanCache": "plancache.cache",
    "Recorded": "plancache.cache",
    "Budget": "plancache.gate",
    "applicable_kv_cache_memory_bytes": "plancache.gate",
    "Observation": "plancache.observation",
    "Plan": "plancache.plan",
    "PutOutcome": "plancache.reasons",
    "Reason": "plancache.reasons",
    "PlanStore": "plancache.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    alias = deprecated_alias(name) or deprecated_reason(name)
    if alias is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return alias


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ArtifactError",
    "Budget",
    "CliError",
    "ConfigError",
    "Decision",
    "InvalidPlanError",
    "InvalidSignatureError",
    "JobTimeout",
    "MissingExtraError",
    "Observation",
    "Plan",
    "PlanCache",
    "PlanStore",
    "PlanStoreConflictError",
    "PlanStoreError",
    "PlanStoreNotFoundError",
    "PlanStorePermissionError",
    "PlanStoreReadOnlyError",
    "PlanStoreUnavailableError",
    "PlancacheError",
    "PutOutcome",
    "RankAgreementError",
    "Reason",
    "Recorded",
    "StoreIgnoresPreconditionsError",
    "UnknownSchemeError",
    "UnreadableHereError",
    "UnsupportedSchemaError",
    "UnsupportedStoreError",
    "__version__",
    "applicable_kv_cache_memory_bytes",
    "fingerprint",
    "open_store",
]
