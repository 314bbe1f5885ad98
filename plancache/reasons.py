"""Why a lookup or a record ended as it did: the reason codes of logs, JSON and metrics (pure).

Members are ``str`` values, so ``decision.reason == "hit"`` holds and logs show the value.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """The reason of a ``Decision``: ``hit`` alone applies a plan."""

    HIT = "hit"
    MISS = "miss"
    """Nothing stored, or a record of another schema version (see the decision's detail)."""
    BELOW_BASELINE = "gate:free-memory-below-baseline"
    FREE_MEMORY_UNKNOWN = "gate:free-memory-unknown"
    EXCEEDS_BUDGET = "gate:exceeds-budget"
    """Every applicable observation's KV cache exceeds requested memory minus the weights."""
    BUDGET_UNKNOWN = "gate:budget-unknown"
    """The budget's figures are malformed (doubt: profile)."""
    CRASHED_BEFORE = "gate:crashed-before"
    """The only applicable observations are ones a boot on this node crashed after applying."""
    INVALID = "invalid"
    """The stored record breaks a rule of the format."""
    INVALID_SIGNATURE = "invalid:signature"
    """Keys are configured and the record lacks a valid signature from an accepted key."""
    INVALID_FACTORS = "invalid-factors"
    STORE_ERROR = "store-error"
    TIMEOUT = "timeout"
    ERROR = "error"
    """Unexpected; the detail names the exception."""


class RecordReason(enum.StrEnum):
    """The reason of a ``Recorded``: the put's outcome, or why nothing was stored."""

    CREATED = "created"
    REPLACED = "replaced"
    KEPT = "kept"
    INVALID_INPUT = "invalid-input"
    STORE_ERROR = "store-error"
    TIMEOUT = "timeout"
    ERROR = "error"
