"""Plans and sizes for tests of plancache and of third-party stores."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import orjson

from plancache._keys import Scalar
from plancache._plan import Plan
from plancache._signing import key_id
from plancache._units import GiB

FACTORS: dict[str, Scalar] = {"model": "test/model", "gpu_memory_utilization": 0.9, "rank": 0}
"""Factors of the default test plan."""


def make_plan(
    kv: int = 10 * GiB,
    baseline: int = 70 * GiB,
    factors: Mapping[str, Scalar] | None = None,
    *,
    producer: Mapping[str, Any] | None = None,
    created_at: float | None = None,
) -> Plan:
    """A valid plan for ``factors`` (default ``FACTORS``), produced by host ``test``."""
    return Plan.new(
        FACTORS if factors is None else factors,
        kv_cache_memory_bytes=kv,
        free_memory_baseline=baseline,
        producer={"host": "test"} if producer is None else producer,
        created_at=created_at,
    )


def newer_schema_record(fp: str, key: str | None = None, **fields: Any) -> bytes:
    """A record of schema 3 (a newer plancache's) under ``fp`` with ``fields``, signed with
    ``key`` (None: unsigned) by the rule every schema keeps: the HMAC-SHA256 of the canonical
    encoding of the record without its signature."""
    record: dict[str, Any] = {"schema": 3, "fingerprint": fp, **fields}
    if key is not None:
        payload = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
        mac = hmac.new(key.encode(), payload, hashlib.sha256).hexdigest()
        record["signature"] = {"keyid": key_id(key), "hmac_sha256": mac}
    return orjson.dumps(record)
