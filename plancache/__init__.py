"""plancache: content-addressed vLLM startup plans, shared by a fleet through any store.

The public API is what this module exports (``__all__``; docs/library.md), plus
``plancache.errors``, the cache API ``plancache.caches``, the integrations (the vLLM plugin
``plancache.integrations.vllm``, the Triton cache manager ``plancache.integrations.triton``,
torch's mega-cache ``plancache.integrations.torch``) and the test kit ``plancache.testing``;
every other module is private (a leading underscore). The public names
load on first use (PEP 562), so ``import plancache`` stays cheap: the vLLM plugin imports it
in every process vLLM starts. The module paths of plancache 0.3.0 (``plancache.store``,
``plancache.backends.local``, ...) still import, with a ``DeprecationWarning``, until 0.6.0.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from plancache._keys import fingerprint
from plancache._moved import install_moved_finder
from plancache._reasons import deprecated_reason
from plancache._version import __version__
from plancache.errors import (
    ArtifactError,
    CliError,
    ConfigError,
    InvalidArgumentError,
    InvalidPlanError,
    InvalidSignatureError,
    JobTimeout,
    MissingExtraError,
    MovedError,
    MovedModuleError,
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

install_moved_finder()

if TYPE_CHECKING:
    from plancache._artifacts.engine import CompileSettings
    from plancache._backends import open_layer, open_store, register_backend
    from plancache._cache import Decision, PendingLookup, PlanCache, Recorded
    from plancache._config import Settings
    from plancache._gate import Budget, applicable_kv_cache_memory_bytes
    from plancache._objects import CREATE, Create, ObjectLayer, Opened, Reader, Update
    from plancache._observation import Observation, Tombstone
    from plancache._plan import Plan, Signature
    from plancache._reasons import PutOutcome, Reason
    from plancache._signing import Keyring, SignatureVerdict
    from plancache._store import PlanStore, Retraction

_LAZY = {
    "CompileSettings": "plancache._artifacts.engine",
    "open_layer": "plancache._backends",
    "open_store": "plancache._backends",
    "register_backend": "plancache._backends",
    "Decision": "plancache._cache",
    "PendingLookup": "plancache._cache",
    "PlanCache": "plancache._cache",
    "Recorded": "plancache._cache",
    "Settings": "plancache._config",
    "Budget": "plancache._gate",
    "applicable_kv_cache_memory_bytes": "plancache._gate",
    "Observation": "plancache._observation",
    "Tombstone": "plancache._observation",
    "CREATE": "plancache._objects",
    "Create": "plancache._objects",
    "ObjectLayer": "plancache._objects",
    "Opened": "plancache._objects",
    "Reader": "plancache._objects",
    "Update": "plancache._objects",
    "Plan": "plancache._plan",
    "Signature": "plancache._plan",
    "PutOutcome": "plancache._reasons",
    "Reason": "plancache._reasons",
    "Keyring": "plancache._signing",
    "SignatureVerdict": "plancache._signing",
    "PlanStore": "plancache._store",
    "Retraction": "plancache._store",
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
    "CREATE",
    "ArtifactError",
    "Budget",
    "CliError",
    "CompileSettings",
    "ConfigError",
    "Create",
    "Decision",
    "InvalidArgumentError",
    "InvalidPlanError",
    "InvalidSignatureError",
    "JobTimeout",
    "Keyring",
    "MissingExtraError",
    "MovedError",
    "MovedModuleError",
    "ObjectLayer",
    "Observation",
    "Opened",
    "PendingLookup",
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
    "Reader",
    "Reason",
    "Recorded",
    "Retraction",
    "Settings",
    "Signature",
    "SignatureVerdict",
    "StoreIgnoresPreconditionsError",
    "Tombstone",
    "UnknownSchemeError",
    "UnreadableHereError",
    "UnsupportedSchemaError",
    "UnsupportedStoreError",
    "Update",
    "__version__",
    "applicable_kv_cache_memory_bytes",
    "fingerprint",
    "open_layer",
    "open_store",
    "register_backend",
]
