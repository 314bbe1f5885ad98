"""The key of a plan: fingerprints of factors, key validation and object names (pure).

A key is 64 lowercase hex characters; every store validates it before any I/O, so no key
can name a path or an object prefix. A plan's object name is ``startup_plan_{key}.json``
in every store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from plancache.plan import Scalar, digest

KEY_LENGTH = 64
OBJECT_PREFIX = "startup_plan_"
OBJECT_SUFFIX = ".json"
_KEY = re.compile(r"[0-9a-f]{64}")
_KEY_PREFIX = re.compile(r"[0-9a-f]{1,64}")


def fingerprint(factors: Mapping[str, Scalar]) -> str:
    """sha256 hex of the canonical encoding of ``factors``; same inputs, same key anywhere.

    Raises ``InvalidPlanError`` (a ``ValueError``) for factors that cannot be encoded.
    """
    return digest(factors)


def validate_key(key: object) -> str:
    """Return ``key`` if it is 64 lowercase hex characters, else raise ``ValueError``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"not a plan fingerprint (64 lowercase hex characters): {key!r:.80}")
    return key


def is_key_prefix(text: str) -> bool:
    """True if ``text`` is 1 to 64 lowercase hex characters: the start of some key."""
    return _KEY_PREFIX.fullmatch(text) is not None


def object_name(fp: str) -> str:
    """``startup_plan_{fp}.json``: the name of a plan in every store."""
    return f"{OBJECT_PREFIX}{fp}{OBJECT_SUFFIX}"


def fingerprint_of_name(name: str) -> str | None:
    """The key a plan object's base name carries, or None for any other name."""
    if not (name.startswith(OBJECT_PREFIX) and name.endswith(OBJECT_SUFFIX)):
        return None
    fp = name[len(OBJECT_PREFIX) : -len(OBJECT_SUFFIX)]
    return fp if _KEY.fullmatch(fp) else None
