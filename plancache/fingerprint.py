"""Fingerprints of factors, and validation of keys before they reach any store (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from plancache.plan import Scalar, digest

_KEY = re.compile(r"[0-9a-f]{64}")


def fingerprint(factors: Mapping[str, Scalar]) -> str:
    """sha256 hex of the canonical encoding of ``factors``; same inputs, same key anywhere.

    Raises ``ValueError`` (an ``InvalidPlanError``) for factors that cannot be encoded.
    """
    return digest(factors)


def validate_key(key: object) -> str:
    """Return ``key`` if it is 64 lowercase hex characters, else raise ``ValueError``.

    Every store calls this before any I/O, so no key can name a path or an object prefix.
    """
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"not a plan fingerprint (64 lowercase hex characters): {key!r:.80}")
    return key
