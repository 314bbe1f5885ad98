"""The parts of a record: observations (what one profiled boot measured) and tombstones
(observations retracted), each validated at construction (pure)."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import orjson

from plancache._defaults import TOMBSTONE_SKEW_S
from plancache.errors import InvalidPlanError

MAX_PRODUCER_BYTES = 1024
"""Largest encoded ``producer`` of one observation."""
MAX_CREATED_AT = 253402300799.0
"""9999-12-31T23:59:59Z: the latest ``created_at`` a record may carry (and the earliest is 0)."""
_MAX_INT = 2**63 - 1
T = TypeVar("T")


def build(cls: type[T], fields: dict[str, Any], *init_vars: object) -> T:
    """What ``cls(**fields, *init_vars)`` makes of a frozen dataclass whose ``__post_init__``
    validates, for the read path: ``fields`` (every field of ``cls``) set at once instead of
    one ``object.__setattr__`` each (about half the cost of the generated ``__init__``),
    then ``__post_init__(*init_vars)``, every check of it."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    obj.__post_init__(*init_vars)  # type: ignore[attr-defined]
    return obj


def _positive_int(name: str, value: object) -> int:
    if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidPlanError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 < value <= _MAX_INT:
        raise InvalidPlanError(f"{name} must be in 1..2**63-1, got {value!r:.40}")
    return value


def _timestamp(value: object) -> float:
    if type(value) is not float and (
        isinstance(value, bool) or not isinstance(value, (int, float))
    ):
        raise InvalidPlanError("created_at must be a number")
    if not (math.isfinite(value) and 0 <= value <= MAX_CREATED_AT):
        raise InvalidPlanError(f"created_at must be a time in years 1970..9999, got {value!r:.40}")
    return float(value)


def _producer(value: object) -> Mapping[str, Any]:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidPlanError("producer must be an object")
    copy = dict(value)
    try:
        size = len(orjson.dumps(copy))
    except TypeError as exc:  # holds something JSON cannot carry
        raise InvalidPlanError(f"producer cannot be encoded: {exc}") from exc
    if size > MAX_PRODUCER_BYTES:
        raise InvalidPlanError(f"producer is {size} bytes encoded, over {MAX_PRODUCER_BYTES}")
    return MappingProxyType(copy)


@dataclass(frozen=True)
class Observation:
    """What one fully profiled boot measured: the KV cache it allocated with the free memory
    it started from. Construction validates; ``kv_cache_memory_bytes <= free_memory_baseline``."""

    kv_cache_memory_bytes: int
    free_memory_baseline: int
    created_at: float
    producer: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kv = _positive_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        baseline = _positive_int("free_memory_baseline", self.free_memory_baseline)
        if kv > baseline:
            raise InvalidPlanError(
                f"kv_cache_memory_bytes {kv} exceeds free_memory_baseline {baseline}"
            )
        object.__setattr__(self, "created_at", _timestamp(self.created_at))
        object.__setattr__(self, "producer", _producer(self.producer))

    def __hash__(self) -> int:
        return hash(self.encode())

    def to_dict(self) -> dict[str, Any]:
        """The observation as plain JSON-ready data."""
        return {
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "free_memory_baseline": self.free_memory_baseline,
            "created_at": self.created_at,
            "producer": dict(self.producer),
        }

    def encode(self) -> bytes:
        """Canonical bytes of the observation (sorted keys): its identity in a total order."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)

    @property
    def digest(self) -> str:
        """sha256 hex digest of :meth:`encode`: names this observation in tombstones and
        crash marks."""
        return hashlib.sha256(self.encode()).hexdigest()

    @classmethod
    def from_dict(cls, obj: object) -> Observation:
        """Validate decoded JSON; raises only ``InvalidPlanError``."""
        if not isinstance(obj, dict):
            raise InvalidPlanError("an observation must be a JSON object")
        try:
            fields = {
                "kv_cache_memory_bytes": obj["kv_cache_memory_bytes"],
                "free_memory_baseline": obj["free_memory_baseline"],
                "created_at": obj["created_at"],
                "producer": obj["producer"],
            }
        except KeyError:
            missing = [k for k in OBSERVATION_FIELDS if k not in obj]
            raise InvalidPlanError(f"observation lacks {', '.join(missing)}") from None
        return build(cls, fields)


OBSERVATION_FIELDS = ("kv_cache_memory_bytes", "free_memory_baseline", "created_at", "producer")
_TOMBSTONE_FIELDS = ("observation", "created_at", "retracted_at")


def is_hex(value: object, length: int) -> bool:
    return (
        type(value) is str and len(value) == length and all(c in "0123456789abcdef" for c in value)
    )


@dataclass(frozen=True)
class Tombstone:
    """A retracted observation: its ``digest`` (``Observation.digest``), its ``created_at``
    (so that pruning can forget tombstones of observations it would prune anyway) and the time
    it was retracted."""

    observation: str
    created_at: float
    retracted_at: float

    def __post_init__(self) -> None:
        if not is_hex(self.observation, 64):
            raise InvalidPlanError("a tombstone names an observation by its sha256 hex digest")
        object.__setattr__(self, "created_at", _timestamp(self.created_at))
        object.__setattr__(self, "retracted_at", _timestamp(self.retracted_at))

    def believable(self, now: float | None = None) -> bool:
        """True unless retracted more than ``TOMBSTONE_SKEW_S`` after ``now`` (default: the
        current time)."""
        return self.retracted_at <= (time.time() if now is None else now) + TOMBSTONE_SKEW_S

    @classmethod
    def of(cls, observation: Observation, retracted_at: float) -> Tombstone:
        """The tombstone of ``observation``, retracted at ``retracted_at``."""
        return cls(observation.digest, observation.created_at, retracted_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "created_at": self.created_at,
            "retracted_at": self.retracted_at,
        }

    @classmethod
    def from_dict(cls, obj: object) -> Tombstone:
        """Validate decoded JSON; raises only ``InvalidPlanError``."""
        if not isinstance(obj, dict) or any(k not in obj for k in _TOMBSTONE_FIELDS):
            raise InvalidPlanError(f"a tombstone is an object with {', '.join(_TOMBSTONE_FIELDS)}")
        return cls(**{k: obj[k] for k in _TOMBSTONE_FIELDS})
