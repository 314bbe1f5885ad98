"""The plan record: observations, validation, canonical encoding and decoding (pure; no I/O).

A plan holds what fully profiled vLLM boots of one worker measured under one key: a frontier
of observations ``(free_memory_baseline, kv_cache_memory_bytes)`` in which a lower baseline
always comes with a smaller KV cache (no observation dominates another). Every record is
self-verifying: its ``fingerprint`` is the sha256 of the canonical encoding of its
``factors``, so a record can be checked without trusting where it came from.

Schema 2 (this version) writes ``observations`` and ``labels``, and ``retracted`` when the
record holds tombstones; a schema-1 record (plancache 0.1.0: one observation at top level) is
read as a one-point frontier and upgraded by the next write; any other schema is
``UnsupportedSchemaError``.

Signatures (``signature``, optional): ``{"keyid": <16 hex>, "hmac_sha256": <64 hex>}``, the
HMAC-SHA256 of :meth:`Plan.payload` (the record's canonical encoding without its signature)
under the key ``keyid`` names. This module only carries it; ``plancache._signing`` makes and
checks it. ``Plan.signature`` takes no part in equality: two records with the same content
are equal however (or whether) they are signed.

Provisional observations (``provisional``, written only when the record holds some): what
boots that compiled during their profiling measured (vLLM #54122: compile and autotuning
temporaries are charged as activation memory, so such a boot allocates less KV cache than a
warm one). A second frontier of at most ``MAX_PROVISIONAL`` points, applied only by boots
that compile too (``plancache._gate``); a reader that does not know the field ignores it, as
every unknown top-level field, and so never applies one.

Tombstones (``retracted``): a retracted observation is removed from the record and named by a
tombstone (its digest, its ``created_at`` and when it was retracted), so that merging an older
copy never brings it back (see ``plancache._merge``). A record whose every observation was
retracted keeps its tombstones and no observation: it applies nowhere, and it still removes
the retracted observations from whatever is merged into it. Tombstones dated more than
``TOMBSTONE_SKEW_S`` ahead of the reader's clock are ignored (``Tombstone.believable``).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

import orjson

from plancache._defaults import TOMBSTONE_SKEW_S
from plancache._keys import Scalar, check_scalar, checked_fingerprint, fingerprint
from plancache._observation import (
    OBSERVATION_FIELDS,
    Observation,
    Tombstone,
    build,
    is_hex,
)
from plancache._version import DEPRECATED_REMOVED_IN
from plancache.errors import InvalidPlanError, UnsupportedSchemaError

SCHEMA = 2
"""The schema this version writes."""
LEGACY_SCHEMA = 1
"""The schema of plancache 0.1.0, read as a one-point frontier."""
MAX_RECORD_BYTES = 64 * 1024
"""Largest encoded record accepted; readers fetch at most this plus one byte."""
MAX_OBSERVATIONS = 32
"""Most observations a record keeps (see ``plancache._merge.frontier`` for which)."""
MAX_PROVISIONAL = 8
"""Most provisional observations a record keeps (its second frontier)."""
MAX_TOMBSTONES = 32
"""Most tombstones a record keeps (see ``plancache._merge.tombstones`` for which)."""
MAX_LABELS = 16
MAX_LABEL_NAME = 64
MAX_LABEL_TEXT = 256
MODEL_LABEL: Final = "model"
"""The label that names a record's model, as ``DEVICE_FACTOR`` is the factor that names the
device its boots ran on: how a record describes itself to a person (``plancache ls``,
``show``, ``stats``). Producers follow it; the vLLM plugin records both."""
DEVICE_FACTOR: Final = "device_name"

_KEY_END = re.compile(rb'"\s*:')
_QUOTE_BLANKS = tuple(b'"' + c for c in (b" ", b"\t", b"\n", b"\r", b"\f", b"\v"))


def _labels(value: object) -> Mapping[str, Scalar]:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidPlanError("labels must be an object")
    if len(value) > MAX_LABELS:
        raise InvalidPlanError(f"{len(value)} labels, over {MAX_LABELS}")
    for name, v in value.items():
        if type(name) is not str or not 0 < len(name) <= MAX_LABEL_NAME:
            raise InvalidPlanError(f"label names are strings of 1..{MAX_LABEL_NAME} characters")
        check_scalar(f"label {name!r}", v)
        if type(v) is str and len(v) > MAX_LABEL_TEXT:
            raise InvalidPlanError(f"label {name!r} is over {MAX_LABEL_TEXT} characters")
    return MappingProxyType(dict(value))


KEY_ID_CHARS = 16
"""Hex digits of a key id (``plancache._signing.key_id``)."""
_MAC_CHARS = 64


@dataclass(frozen=True)
class Signature:
    """A record's signature: the id of the key (``KEY_ID_CHARS`` lowercase hex) and the
    HMAC-SHA256 of ``Plan.payload`` under that key (64 lowercase hex). Checked for form
    only; whether it is right is ``plancache._signing``'s to say."""

    keyid: str
    hmac_sha256: str

    def __post_init__(self) -> None:
        if not is_hex(self.keyid, KEY_ID_CHARS):
            raise InvalidPlanError(f"a signature's keyid is {KEY_ID_CHARS} lowercase hex digits")
        if not is_hex(self.hmac_sha256, _MAC_CHARS):
            raise InvalidPlanError(
                f"a signature's hmac_sha256 is {_MAC_CHARS} lowercase hex digits"
            )

    def to_dict(self) -> dict[str, str]:
        return {"keyid": self.keyid, "hmac_sha256": self.hmac_sha256}

    @classmethod
    def from_dict(cls, obj: object) -> Signature:
        """Validate decoded JSON; raises only ``InvalidPlanError``."""
        if not isinstance(obj, dict) or set(obj) != {"keyid", "hmac_sha256"}:
            raise InvalidPlanError("a signature is an object with keyid and hmac_sha256 only")
        return cls(obj["keyid"], obj["hmac_sha256"])


@dataclass(frozen=True)
class Plan:
    """One validated record. Construction validates every rule; instances are valid.

    ``observations`` is a frontier sorted by baseline: baselines and KV sizes both strictly
    increase, so no observation dominates another and the first applies on the most nodes.
    ``schema`` is the schema the record was read as (``LEGACY_SCHEMA`` or ``SCHEMA``);
    ``encode`` always writes ``SCHEMA``. ``provisional``: a second frontier, of what boots
    that compiled during profiling measured (at most ``MAX_PROVISIONAL``). ``retracted``:
    tombstones sorted by digest, none naming an observation of the record; a record without
    observations holds provisional ones or at least one tombstone.
    ``signature``: carried as read (``Plan.decode``) or made by ``plancache._signing``; never
    compared, and dropped by everything that builds a new record (merge, ``keeping``).
    """

    fingerprint: str
    factors: Mapping[str, Scalar]
    observations: tuple[Observation, ...]
    labels: Mapping[str, Scalar] = field(default_factory=dict)
    schema: int = SCHEMA
    retracted: tuple[Tombstone, ...] = ()
    signature: Signature | None = field(default=None, compare=False)
    provisional: tuple[Observation, ...] = ()
    decoded: InitVar[bool] = False
    """Set by ``decode`` only: ``factors`` is what ``orjson.loads`` returned (checked alike,
    with fewer steps: see ``check_factors``), and the tuples of parts and the signature are
    ones ``decode`` built (their types need no check)."""

    def __post_init__(self, decoded: bool) -> None:
        if type(self.schema) is not int or self.schema not in (LEGACY_SCHEMA, SCHEMA):
            raise InvalidPlanError(f"unsupported schema {self.schema!r} (expected {SCHEMA})")
        factors, key = checked_fingerprint(self.factors, decoded=decoded is True)
        if not isinstance(self.fingerprint, str) or self.fingerprint != key:
            raise InvalidPlanError("fingerprint does not match the sha256 of the factors")
        obs, tombs, prov = self.observations, self.retracted, self.provisional
        if decoded is not True:  # decode builds its tuples of parts itself
            for name, points in (("observations", obs), ("provisional", prov)):
                if not isinstance(points, tuple) or not all(
                    isinstance(o, Observation) for o in points
                ):
                    raise InvalidPlanError(f"{name} must be a tuple of Observation")
            if not isinstance(tombs, tuple) or not all(isinstance(t, Tombstone) for t in tombs):
                raise InvalidPlanError("retracted must be a tuple of Tombstone")
            if self.signature is not None and not isinstance(self.signature, Signature):
                raise InvalidPlanError("signature must be a Signature or None")
        if len(obs) > MAX_OBSERVATIONS or not (obs or tombs or prov):
            raise InvalidPlanError(
                f"a record holds 1..{MAX_OBSERVATIONS} observations (0 only with provisional "
                "ones or tombstones)"
            )
        if len(prov) > MAX_PROVISIONAL:
            raise InvalidPlanError(f"a record holds at most {MAX_PROVISIONAL} provisional ones")
        if tombs:
            if len(tombs) > MAX_TOMBSTONES:
                raise InvalidPlanError(f"a record holds at most {MAX_TOMBSTONES} tombstones")
            if any(a.observation >= b.observation for a, b in itertools.pairwise(tombs)):
                raise InvalidPlanError("tombstones are not sorted by digest without repeats")
            dead = {t.observation for t in tombs}
            if any(o.digest in dead for o in (*obs, *prov)):
                raise InvalidPlanError("a record holds an observation it also retracted")
        for name, points in (("observations", obs), ("provisional", prov)):
            for low, high in itertools.pairwise(points):
                if not (
                    low.free_memory_baseline < high.free_memory_baseline
                    and low.kv_cache_memory_bytes < high.kv_cache_memory_bytes
                ):
                    raise InvalidPlanError(
                        f"{name} are not a frontier sorted by baseline (one dominates another)"
                    )
        object.__setattr__(self, "factors", MappingProxyType(factors))
        object.__setattr__(self, "labels", _labels(self.labels))

    @classmethod
    def new(
        cls,
        factors: Mapping[str, Scalar],
        *,
        kv_cache_memory_bytes: int,
        free_memory_baseline: int,
        producer: Mapping[str, Any] | None = None,
        created_at: float | None = None,
        labels: Mapping[str, Scalar] | None = None,
        provisional: bool = False,
    ) -> Plan:
        """A one-observation plan for ``factors`` (``provisional``: measured by a boot that
        compiled during profiling); raises ``InvalidPlanError`` on bad input."""
        observation = Observation(
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            free_memory_baseline=free_memory_baseline,
            created_at=time.time() if created_at is None else created_at,
            producer=producer or {},
        )
        if provisional:
            return cls(fingerprint(factors), factors, (), labels or {}, provisional=(observation,))
        return cls(fingerprint(factors), factors, (observation,), labels or {})

    # -- the frontier's extremes and newest point, for listings ---------------------------
    # (each Observation has its own kv_cache_memory_bytes and free_memory_baseline)
    @property
    def max_kv_cache_memory_bytes(self) -> int:
        """The largest KV cache any observation allocated (the last one's); 0 without any."""
        return self.observations[-1].kv_cache_memory_bytes if self.observations else 0

    @property
    def min_free_memory_baseline(self) -> int:
        """The lowest baseline of any observation (the first one's): below it nothing applies;
        0 without any."""
        return self.observations[0].free_memory_baseline if self.observations else 0

    @property
    def kv_cache_memory_bytes(self) -> int:
        """Deprecated alias of ``max_kv_cache_memory_bytes``; warns with ``DeprecationWarning``."""
        message = (
            "Plan.kv_cache_memory_bytes is deprecated: use Plan.max_kv_cache_memory_bytes "
            f"(removed in plancache {DEPRECATED_REMOVED_IN})"
        )
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return self.max_kv_cache_memory_bytes

    @property
    def free_memory_baseline(self) -> int:
        """Deprecated alias of ``min_free_memory_baseline``; warns with ``DeprecationWarning``."""
        message = (
            "Plan.free_memory_baseline is deprecated: use Plan.min_free_memory_baseline "
            f"(removed in plancache {DEPRECATED_REMOVED_IN})"
        )
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return self.min_free_memory_baseline

    @property
    def newest(self) -> Observation | None:
        """The most recently created observation, provisional ones included (None in a
        record of tombstones only)."""
        return max(
            (*self.observations, *self.provisional), key=lambda o: o.created_at, default=None
        )

    @property
    def created_at(self) -> float:
        """When the newest observation was made (else the latest retraction)."""
        if self.newest is not None:
            return self.newest.created_at
        return max(t.retracted_at for t in self.retracted)

    def keeping(
        self,
        keep: Callable[[Observation], bool],
        keep_tombstone: Callable[[Tombstone], bool] = lambda t: True,
    ) -> Plan | None:
        """This record with only the observations (provisional ones too) ``keep`` and the
        tombstones ``keep_tombstone`` accept; None if nothing is left."""
        kept = tuple(o for o in self.observations if keep(o))
        prov = tuple(o for o in self.provisional if keep(o))
        tombs = tuple(t for t in self.retracted if keep_tombstone(t))
        if not (kept or prov or tombs):
            return None
        return Plan(
            self.fingerprint, self.factors, kept, self.labels, retracted=tombs, provisional=prov
        )

    def signed(self, signature: Signature | None) -> Plan:
        """This record carrying ``signature`` (None: unsigned); the content is unchanged."""
        return replace(self, signature=signature)

    # -- encoding -------------------------------------------------------------------------
    def _body(self) -> dict[str, Any]:
        body = {
            "schema": SCHEMA,
            "fingerprint": self.fingerprint,
            "factors": dict(self.factors),
            "observations": [o.to_dict() for o in self.observations],
            "labels": dict(self.labels),
        }
        if self.provisional:
            body["provisional"] = [o.to_dict() for o in self.provisional]
        if self.retracted:
            body["retracted"] = [t.to_dict() for t in self.retracted]
        return body

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready data (always in schema ``SCHEMA``), its signature
        included when it carries one."""
        body = self._body()
        if self.signature is not None:
            body["signature"] = self.signature.to_dict()
        return body

    def payload(self) -> bytes:
        """Canonical bytes of the record without its signature (orjson, sorted keys): what a
        signature covers. Equal records have equal payloads."""
        return orjson.dumps(self._body(), option=orjson.OPT_SORT_KEYS)

    def encode(self) -> bytes:
        """JSON bytes of the record (sorted keys), its signature included; raises
        :class:`InvalidPlanError` if over the size limit. An unsigned record encodes as its
        :meth:`payload`."""
        data = orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidPlanError(f"record is {len(data)} bytes, over {MAX_RECORD_BYTES}")
        return data

    @classmethod
    def decode(
        cls, data: bytes, *, expected_fingerprint: str | None = None, now: float | None = None
    ) -> Plan:
        """Parse and validate a record. Raises only :class:`InvalidPlanError`.

        ``expected_fingerprint`` (the key the record was read under) must match the body.
        Unknown top-level fields are ignored; a ``signature`` must be well formed (it is
        carried, not checked); duplicate keys are invalid; a schema-1 record
        is read as a one-point frontier; another integer ``schema`` raises
        :class:`UnsupportedSchemaError` (a miss for the cache; stores never overwrite it).
        A record without observations whose every tombstone is dated too far ahead of
        ``now`` to be believed (``Tombstone.believable``) holds nothing: invalid.
        """
        if type(data) is not bytes:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise InvalidPlanError(f"record must be bytes, not {type(data).__name__}")
            data = bytes(data)
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidPlanError(f"record is over {MAX_RECORD_BYTES} bytes")
        obj = _loads(data)
        if type(obj) is not dict:
            raise InvalidPlanError("record must be a JSON object")
        schema = obj.get("schema")
        if type(schema) is not int:
            raise InvalidPlanError(f"record's schema must be an int, not {schema!r:.40}")
        if schema not in (LEGACY_SCHEMA, SCHEMA):
            raise UnsupportedSchemaError(
                f"record has schema {schema}; this plancache reads {LEGACY_SCHEMA} and {SCHEMA}"
            )
        required = _LEGACY_FIELDS if schema == LEGACY_SCHEMA else _FIELDS
        if not obj.keys() >= required:
            raise InvalidPlanError(f"record lacks {', '.join(sorted(required - obj.keys()))}")
        if expected_fingerprint is not None and obj["fingerprint"] != expected_fingerprint:
            raise InvalidPlanError("record's fingerprint does not match the key it is stored under")
        observations: tuple[Observation, ...]
        tombs: tuple[Tombstone, ...] = ()
        provisional: tuple[Observation, ...] = ()
        signature = None
        if schema == LEGACY_SCHEMA:
            observations = (Observation.from_dict(obj),)
        else:
            if type(obj["observations"]) is not list:
                raise InvalidPlanError("observations must be a JSON array")
            observations = tuple(map(Observation.from_dict, obj["observations"]))
            if "provisional" in obj:
                if type(obj["provisional"]) is not list:
                    raise InvalidPlanError("provisional must be a JSON array")
                provisional = tuple(map(Observation.from_dict, obj["provisional"]))
            if "retracted" in obj:
                if type(obj["retracted"]) is not list:
                    raise InvalidPlanError("retracted must be a JSON array")
                tombs = tuple(map(Tombstone.from_dict, obj["retracted"]))
            if "signature" in obj:
                signature = Signature.from_dict(obj["signature"])
        factors = obj["factors"]
        fields = {
            "fingerprint": obj["fingerprint"],
            "factors": factors,
            "observations": observations,
            "labels": obj.get("labels", {}),
            "schema": schema,
            "retracted": tombs,
            "signature": signature,
            "provisional": provisional,
        }
        plan = build(cls, fields, type(factors) is dict)
        if not (observations or provisional or any(t.believable(now) for t in tombs)):
            raise InvalidPlanError(
                "record holds no observation and only tombstones dated more than "
                f"{TOMBSTONE_SKEW_S:g} s ahead"
            )
        return plan


_FIELDS = frozenset(("schema", "fingerprint", "factors", "observations"))
_LEGACY_FIELDS = frozenset(("schema", "fingerprint", "factors", *OBSERVATION_FIELDS))


def _key_count(value: dict[str, Any] | list[Any]) -> int:
    """How many object keys ``value`` (a parsed JSON object or array) holds, at every depth."""
    n, items = (len(value), value.values()) if type(value) is dict else (0, value)
    for v in items:
        if type(v) is dict or type(v) is list:
            n += _key_count(v)
    return n


def _reject_duplicate_keys(data: bytes) -> None:
    """``InvalidPlanError`` if an object in ``data`` (valid JSON) has a key twice."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise InvalidPlanError("record has a duplicate key in one object")
        return dict(pairs)

    json.loads(data, object_pairs_hook=unique)


def _loads(data: bytes) -> object:
    """Strict JSON (UTF-8, no NaN or Infinity) with no key given twice in one object."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidPlanError(f"record is not valid JSON: {exc}") from None
    if type(obj) is dict and _written_as_is(obj, data):
        return obj
    if isinstance(obj, (dict, list)) and _key_ends(data) != _key_count(obj):
        _reject_duplicate_keys(data)  # more `":` than keys: a string holds one, or a key repeats
    return obj


def _written_as_is(obj: dict[str, Any], data: bytes) -> bool:
    """True if ``data`` is the canonical encoding of ``obj`` (orjson, sorted keys), as
    plancache writes records: then no key repeats (one given twice would shorten the
    re-encoding)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) == data
    except TypeError:  # nested deeper than orjson encodes
        return False


def _key_ends(data: bytes) -> int:
    """How many places in ``data`` look like a key's end (a quote, maybe blanks, a colon): at
    least the number of keys written, duplicates included. Without a quote followed by a
    blank (as every record plancache writes), a plain count finds them all."""
    if any(blank in data for blank in _QUOTE_BLANKS):
        return len(_KEY_END.findall(data))
    return data.count(b'":')
