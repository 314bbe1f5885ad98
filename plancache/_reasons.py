"""Why a decision ended as it did: the reason codes of logs, JSON, events and metrics (pure).

One enum, ``Reason``, for every kind: a plan's lookup, a fetch of compile artifacts, cache
bundles or model info (``FETCH_REASONS``), and the vLLM plugin's boot.
Members are ``str`` values, so ``decision.reason == "hit"`` holds and logs show the value.
A record's reason is the ``PutOutcome`` of its put when the put ran, else the ``Reason`` it
failed for (``RECORD_FAILURES``).
"""

from __future__ import annotations

import enum
import functools
import warnings
from typing import cast

from plancache._version import DEPRECATED_REMOVED_IN


class PutOutcome(enum.StrEnum):
    """What ``PlanStore.put`` did (also ``plancache._store.PutOutcome``)."""

    CREATED = "created"
    REPLACED = "replaced"
    KEPT = "kept"


class Reason(enum.StrEnum):
    """The reason of a ``Decision`` (``hit`` alone applies a plan), and of a ``Recorded``
    that stored nothing (one of ``RECORD_FAILURES``)."""

    HIT = "hit"
    MISS = "miss"
    """Nothing stored, or a record of another schema version (see the decision's detail)."""
    BELOW_BASELINE = "gate:free-memory-below-baseline"
    FREE_MEMORY_UNKNOWN = "gate:free-memory-unknown"
    EXCEEDS_BUDGET = "gate:exceeds-budget"
    """Every applicable observation's KV cache exceeds requested memory minus the weights."""
    BUDGET_UNKNOWN = "gate:budget-unknown"
    """The budget's figures are malformed (doubt: profile)."""
    PROVISIONAL = "gate:provisional"
    """Only observations of boots that compiled during profiling would apply, and this boot
    is not known to compile: it profiles once, and its warm observation serves later boots."""
    CRASHED_BEFORE = "gate:crashed-before"
    """The only applicable observations are ones a boot on this node crashed after applying."""
    INVALID = "invalid"
    """The stored record breaks a rule of the format."""
    INVALID_SIGNATURE = "invalid:signature"
    """Keys are configured and the record lacks a valid signature from an accepted key."""
    INVALID_FACTORS = "invalid-factors"
    INVALID_INPUT = "invalid-input"
    """A record's values make no valid plan (nothing was written)."""
    STORE_ERROR = "store-error"
    TIMEOUT = "timeout"
    ERROR = "error"
    """Unexpected; the detail names the exception."""
    PRESENT = "present"
    """A fetch found what it looked for installed already (nothing was read)."""
    UNTRUSTED = "untrusted"
    """A fetch found nothing the trust rule accepts (no key signed it, or another user
    could have written it)."""
    SLOW = "slow"
    """A fetch was given up: at its pace it could not beat building the thing here."""
    EXPLICIT = "explicit"
    """The vLLM plugin's boot: ``kv_cache_memory_bytes`` was set explicitly (no lookup)."""
    OTHER_RANK = "agreement:another-rank-profiles"
    """The vLLM plugin's boot: this rank had a plan, another rank must profile, so all do."""
    NO_CRASH_MARK = "breaker:no-crash-mark"
    """The vLLM plugin's boot: no crash mark could be written, so the plan is not applied."""
    CONFIG_ERROR = "config-error"
    """The vLLM plugin's boot: a ``PLANCACHE_*`` setting is malformed; plancache is off."""


RECORD_FAILURES = (Reason.INVALID_INPUT, Reason.STORE_ERROR, Reason.TIMEOUT, Reason.ERROR)
"""The reasons of a ``Recorded`` that stored nothing."""

INSTALLED = (Reason.HIT, Reason.PRESENT)
"""The reasons of a fetch that found what it looked for."""

FETCH_REASONS = (
    *INSTALLED,
    Reason.MISS,
    Reason.UNTRUSTED,
    Reason.INVALID,
    Reason.STORE_ERROR,
    Reason.TIMEOUT,
    Reason.SLOW,
)
"""The reasons of a fetch of a kind besides plans (compile artifacts, cache bundles, model
info): ``hit`` (installed), ``present``, ``miss``, ``untrusted``, ``invalid``,
``store-error``, ``timeout``, ``slow``."""


@functools.cache
def _record_reason() -> type[enum.StrEnum]:
    """0.2.0's ``RecordReason``: the members of ``PutOutcome`` and ``RECORD_FAILURES``, by
    name, with their values (so equal to them, as ``str``)."""
    members = [(m.name, m.value) for m in (*PutOutcome, *RECORD_FAILURES)]
    return cast("type[enum.StrEnum]", enum.StrEnum("RecordReason", members))  # the functional API


def deprecated_reason(name: str) -> type[enum.StrEnum] | None:
    """``RecordReason`` (deprecated in 0.3.0: a ``Recorded``'s reason is a ``PutOutcome`` or
    a ``Reason``) for that name, with a ``DeprecationWarning``; None for any other name."""
    if name != "RecordReason":
        return None
    warnings.warn(
        "plancache.RecordReason is deprecated: a Recorded's reason is a PutOutcome (stored) "
        f"or a Reason (not stored) (removed in plancache {DEPRECATED_REMOVED_IN})",
        DeprecationWarning,
        stacklevel=3,
    )
    return _record_reason()


def __getattr__(name: str) -> type[enum.StrEnum]:
    cls = deprecated_reason(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls
