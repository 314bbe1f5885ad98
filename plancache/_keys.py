"""The key of a plan: the canonical encoding of factors, fingerprints, key validation and
object names (pure).

Factors are a non-empty object of exact ``str``/``int``/``float``/``bool``/``None`` values;
their canonical encoding (orjson, sorted keys, no whitespace) is a frozen format, and the key
is its sha256. A key is 64 lowercase hex characters; every store validates it before any I/O,
so no key can name a path or an object prefix. A plan's object name is
``startup_plan_{key}.json`` in every store.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plancache.errors import InvalidArgumentError, InvalidPlanError

Scalar = str | int | float | bool | None
SCALAR_TYPES = (str, int, float, bool, type(None))
"""The exact types a factor (or a label) may have: subclasses (numpy.float64, str enums) do
not encode alike everywhere."""
_INT_RANGE = range(-(2**63), 2**64)  # what orjson encodes (and decodes as int)
_CONTAINERS = frozenset((dict, list))

OBJECT_PREFIX = "startup_plan_"
OBJECT_SUFFIX = ".json"
_KEY = re.compile(r"[0-9a-f]{64}")
_KEY_PREFIX = re.compile(r"[0-9a-f]{1,64}")


def check_scalar(what: str, value: object) -> None:
    """``InvalidPlanError`` naming ``what`` unless ``value`` is an exact scalar that encodes
    the same everywhere: a finite float, an int orjson encodes, a str, a bool or None."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return
    if kind not in SCALAR_TYPES:
        raise InvalidPlanError(f"{what} must be str, int, float, bool or None, not {kind.__name__}")
    if kind is float and not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidPlanError(f"{what} is not a finite number: {value!r}")
    if kind is int and value not in _INT_RANGE:
        raise InvalidPlanError(f"{what} is outside the 64-bit range")


def check_factors(factors: object, *, decoded: bool = False) -> dict[str, Scalar]:
    """``factors`` as a dict if they can be encoded canonically, else ``InvalidPlanError``.

    ``decoded``: ``factors`` is a dict ``orjson.loads`` returned, whose keys are ``str``, ints
    64-bit and floats finite; only values that are containers remain to be refused, and the
    dict is returned as it is (no one else holds it)."""
    if type(factors) is not dict and not isinstance(factors, Mapping):
        raise InvalidPlanError(f"factors must be an object, not {type(factors).__name__}")
    if not factors:
        raise InvalidPlanError("factors must not be empty")
    if decoded and type(factors) is dict and _CONTAINERS.isdisjoint(map(type, factors.values())):
        return factors
    out = dict(factors)
    for key, value in out.items():
        if type(key) is not str:
            raise InvalidPlanError(f"factor names must be strings, got {key!r}")
        if type(value) is not str:  # the common case needs no further check
            check_scalar(f"factor {key!r}", value)
    return out


def checked_fingerprint(factors: object, *, decoded: bool = False) -> tuple[dict[str, Scalar], str]:
    """(``factors`` as a checked dict, their fingerprint), checking them once; raises
    ``InvalidPlanError`` like :func:`fingerprint` (``decoded``: see ``check_factors``)."""
    checked = check_factors(factors, decoded=decoded)
    key = hashlib.sha256(_encode(checked)).hexdigest()
    return checked, key


def canonical(factors: Mapping[str, Scalar]) -> bytes:
    """Canonical bytes of ``factors``: orjson, sorted keys, no whitespace. Frozen format."""
    return _encode(check_factors(factors))


def _encode(checked: dict[str, Scalar]) -> bytes:
    import orjson  # on first use: ``import plancache`` stays cheap (orjson loads json, uuid...)

    return orjson.dumps(checked, option=orjson.OPT_SORT_KEYS)


def fingerprint(factors: Mapping[str, Scalar]) -> str:
    """sha256 hex of the canonical encoding of ``factors``; same inputs, same key anywhere.

    Raises ``InvalidPlanError`` (a ``ValueError``) for factors that cannot be encoded.
    """
    return checked_fingerprint(factors)[1]


def validate_key(key: object) -> str:
    """Return ``key`` if it is 64 lowercase hex characters, else raise ``InvalidArgumentError``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidArgumentError(
            f"not a plan fingerprint (64 lowercase hex characters): {key!r:.80}"
        )
    return key


def is_key_prefix(text: str) -> bool:
    """True if ``text`` is 1 to 64 lowercase hex characters: the start of some key."""
    return _KEY_PREFIX.fullmatch(text) is not None


def plan_object_name(fp: str) -> str:
    """``startup_plan_{fp}.json``: the name of a plan in every store."""
    return f"{OBJECT_PREFIX}{fp}{OBJECT_SUFFIX}"


def fingerprint_of_name(name: str) -> str | None:
    """The key a plan object's base name carries, or None for any other name."""
    if not (name.startswith(OBJECT_PREFIX) and name.endswith(OBJECT_SUFFIX)):
        return None
    fp = name[len(OBJECT_PREFIX) : -len(OBJECT_SUFFIX)]
    return fp if _KEY.fullmatch(fp) else None


ABSENT = object()
"""The value of a factor one side of a ``Difference`` lacks."""


@dataclass(frozen=True)
class Difference:
    """One factor whose value differs: the stored plan's and the node's (``ABSENT`` where
    one side lacks it)."""

    factor: str
    stored: object
    given: object

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"factor": self.factor}
        if self.stored is not ABSENT:
            out["stored"] = self.stored
        if self.given is not ABSENT:
            out["given"] = self.given
        return out


def differences(stored: Mapping[str, Scalar], given: Mapping[str, Scalar]) -> list[Difference]:
    """The factors whose values differ between ``stored`` and ``given``, by name; a value
    of another type counts as different (``1`` is not ``1.0``, ``True`` is not ``1``)."""
    out = []
    for name in sorted(stored.keys() | given.keys()):
        a, b = stored.get(name, ABSENT), given.get(name, ABSENT)
        if a is ABSENT or b is ABSENT or type(a) is not type(b) or a != b:
            out.append(Difference(name, a, b))
    return out
