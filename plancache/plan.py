"""The plan record: validation, canonical encoding and decoding (pure; no I/O).

A plan is the outcome of one fully profiled vLLM boot for one worker. Every record is
self-verifying: its ``fingerprint`` is the sha256 of the canonical encoding of its
``factors``, so a record can be checked without trusting where it came from.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import orjson

from plancache.errors import InvalidPlanError, UnsupportedSchemaError

SCHEMA = 1
MAX_RECORD_BYTES = 64 * 1024
"""Largest encoded record accepted; readers fetch at most this plus one byte."""

_MAX_INT = 2**63 - 1
_MIN_FACTOR_INT = -(2**63)
_FACTOR_INT_LIMIT = 2**64  # orjson encodes ints in [-2**63, 2**64)
MAX_CREATED_AT = 253402300800.0
"""``created_at`` is a Unix time before this one (year 10000 UTC), and not negative."""
_KEY_END = re.compile(rb'"\s*:')

Scalar = str | int | float | bool | None


_SCALARS = (str, int, float, bool, type(None))


def _check_factors(factors: object) -> dict[str, Scalar]:
    if not isinstance(factors, Mapping):
        raise InvalidPlanError(f"factors must be an object, not {type(factors).__name__}")
    if not factors:
        raise InvalidPlanError("factors must not be empty")
    out = dict(factors)
    for key, value in out.items():
        if type(key) is not str:
            raise InvalidPlanError(f"factor names must be strings, got {key!r}")
        kind = type(value)
        # exact types only: subclasses (numpy.float64, str enums) do not encode alike everywhere
        if kind not in _SCALARS:
            raise InvalidPlanError(
                f"factor {key!r} must be str, int, float, bool or None, not {kind.__name__}"
            )
        if kind is float and not math.isfinite(value):
            raise InvalidPlanError(f"factor {key!r} is not a finite number: {value!r}")
        if kind is int and not _MIN_FACTOR_INT <= value < _FACTOR_INT_LIMIT:
            raise InvalidPlanError(f"factor {key!r} is outside the 64-bit range")
    return out


def _encode_checked(factors: dict[str, Scalar]) -> bytes:
    return orjson.dumps(factors, option=orjson.OPT_SORT_KEYS)


def canonical(factors: Mapping[str, Scalar]) -> bytes:
    """Canonical bytes of ``factors``: orjson, sorted keys, no whitespace. Frozen format."""
    return _encode_checked(_check_factors(factors))


def digest(factors: Mapping[str, Scalar]) -> str:
    """sha256 hex digest of :func:`canonical` ``(factors)``."""
    return hashlib.sha256(canonical(factors)).hexdigest()


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidPlanError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 < value <= _MAX_INT:
        raise InvalidPlanError(f"{name} must be in 1..2**63-1, got {value!r:.40}")
    return value


@dataclass(frozen=True)
class Plan:
    """One validated schema-1 record. Construction validates every rule; instances are valid."""

    fingerprint: str
    factors: Mapping[str, Scalar]
    kv_cache_memory_bytes: int
    free_memory_baseline: int
    created_at: float
    producer: Mapping[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        if type(self.schema) is not int or self.schema != SCHEMA:
            raise InvalidPlanError(f"unsupported schema {self.schema!r} (expected {SCHEMA})")
        factors = _check_factors(self.factors)
        kv = _positive_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        baseline = _positive_int("free_memory_baseline", self.free_memory_baseline)
        if kv > baseline:
            raise InvalidPlanError(
                f"kv_cache_memory_bytes {kv} exceeds free_memory_baseline {baseline}"
            )
        if (
            not isinstance(self.fingerprint, str)
            or self.fingerprint != hashlib.sha256(_encode_checked(factors)).hexdigest()
        ):
            raise InvalidPlanError("fingerprint does not match the sha256 of the factors")
        created = self.created_at
        if isinstance(created, bool) or not isinstance(created, (int, float)):
            raise InvalidPlanError("created_at must be a number")
        if not (math.isfinite(created) and 0 <= created < MAX_CREATED_AT):
            raise InvalidPlanError(
                f"created_at must be a Unix time from 0 to before year 10000, got {created!r:.40}"
            )
        if not isinstance(self.producer, Mapping):
            raise InvalidPlanError("producer must be an object")
        object.__setattr__(self, "created_at", float(created))
        object.__setattr__(self, "factors", MappingProxyType(factors))
        object.__setattr__(self, "producer", MappingProxyType(dict(self.producer)))

    @classmethod
    def new(
        cls,
        factors: Mapping[str, Scalar],
        *,
        kv_cache_memory_bytes: int,
        free_memory_baseline: int,
        producer: Mapping[str, Any] | None = None,
        created_at: float | None = None,
    ) -> Plan:
        """Build a plan for ``factors``; raises :class:`InvalidPlanError` on bad input."""
        return cls(
            fingerprint=digest(factors),
            factors=factors,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            free_memory_baseline=free_memory_baseline,
            created_at=time.time() if created_at is None else created_at,
            producer=producer or {},
        )

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready data."""
        return {
            "schema": self.schema,
            "fingerprint": self.fingerprint,
            "factors": dict(self.factors),
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "free_memory_baseline": self.free_memory_baseline,
            "created_at": self.created_at,
            "producer": dict(self.producer),
        }

    def encode(self) -> bytes:
        """JSON bytes of the record; raises :class:`InvalidPlanError` if over the size limit."""
        try:
            data = orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:  # producer holds something JSON cannot carry
            raise InvalidPlanError(f"record cannot be encoded: {exc}") from exc
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidPlanError(f"record is {len(data)} bytes, over {MAX_RECORD_BYTES}")
        return data

    @classmethod
    def decode(cls, data: bytes, *, expected_fingerprint: str | None = None) -> Plan:
        """Parse and validate a record. Raises only :class:`InvalidPlanError`.

        ``expected_fingerprint`` (the key the record was read under) must match the body.
        Unknown top-level fields are ignored; another integer ``schema`` raises
        :class:`UnsupportedSchemaError` (a miss for the cache; stores never overwrite it).
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidPlanError(f"record must be bytes, not {type(data).__name__}")
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidPlanError(f"record is over {MAX_RECORD_BYTES} bytes")
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidPlanError(f"record is not valid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise InvalidPlanError("record must be a JSON object")
        if len(_KEY_END.findall(data)) != _key_count(obj):  # maybe a key given twice
            _reject_duplicate_keys(data)
        schema = obj.get("schema")
        if type(schema) is int and schema != SCHEMA:
            raise UnsupportedSchemaError(
                f"record has schema {schema}; this plancache reads {SCHEMA}"
            )
        missing = [k for k in _FIELDS if k not in obj]
        if missing:
            raise InvalidPlanError(f"record lacks {', '.join(missing)}")
        if expected_fingerprint is not None and obj["fingerprint"] != expected_fingerprint:
            raise InvalidPlanError("record's fingerprint does not match the key it is stored under")
        return cls(**{k: obj[k] for k in _FIELDS})


def _key_count(value: dict[str, Any] | list[Any]) -> int:
    """How many object keys ``value`` (a parsed JSON object or array) holds, at every depth."""
    n, items = (len(value), value.values()) if type(value) is dict else (0, value)
    for v in items:
        if type(v) is dict or type(v) is list:
            n += _key_count(v)
    return n


def _reject_duplicate_keys(data: bytes | bytearray | memoryview) -> None:
    """``InvalidPlanError`` if an object in ``data`` (valid JSON) has a key twice. (Each key
    ends with ``"`` and ``:``; where there are more such byte pairs than parsed keys, a string
    holds one or a key repeats: this slower parse tells which.)"""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidPlanError(f"record has a duplicate key {key!r:.40}")
            seen.add(key)
        return dict(pairs)

    json.loads(bytes(data), object_pairs_hook=unique)


_FIELDS = (
    "schema",
    "fingerprint",
    "factors",
    "kv_cache_memory_bytes",
    "free_memory_baseline",
    "created_at",
    "producer",
)
