"""The record format: validation rules, and decode on hostile input (the key and its
encoding: test_fingerprint.py)."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancache import InvalidPlanError, Plan
from plancache.plan import MAX_RECORD_BYTES, canonical
from plancache.testing import GiB, make_plan


def test_round_trip_and_unknown_fields_ignored() -> None:
    plan = make_plan()
    assert Plan.decode(plan.encode()) == plan
    extended = orjson.loads(plan.encode()) | {"future_field": [1, 2, 3]}
    assert Plan.decode(orjson.dumps(extended)) == plan


def _record(**changes: Any) -> bytes:
    data = orjson.loads(make_plan().encode())
    for k, v in changes.items():
        if v is _DELETE:
            del data[k]
        else:
            data[k] = v
    return orjson.dumps(data)


_DELETE = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema": 2}, "schema 2"),
        ({"schema": True}, "schema"),
        ({"schema": 1.0}, "schema"),
        ({"schema": "1"}, "schema"),
        ({"kv_cache_memory_bytes": True}, "int"),
        ({"free_memory_baseline": 1.5e11}, "int"),
        ({"kv_cache_memory_bytes": -1}, "1..2"),
        ({"kv_cache_memory_bytes": 0}, "1..2"),
        ({"kv_cache_memory_bytes": 80 * GiB}, "exceeds"),
        ({"free_memory_baseline": 2**63}, "1..2"),
        ({"fingerprint": "0" * 64}, "fingerprint"),
        ({"factors": {"model": "tampered"}}, "fingerprint"),
        ({"created_at": "yesterday"}, "created_at"),
        ({"producer": "me"}, "producer"),
        ({"factors": _DELETE}, "lacks"),
    ],
)
def test_decode_rejects_rule_breakers(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        Plan.decode(_record(**changes))


@pytest.mark.parametrize("raw", [b"NaN", b"[1]", b'"x"', b"", b"{", b"\x00" * 10])
def test_decode_rejects_non_records(raw: bytes) -> None:
    with pytest.raises(InvalidPlanError):
        Plan.decode(raw)


def test_nan_in_the_body_is_invalid() -> None:
    raw = make_plan().encode().replace(b'"created_at":', b'"created_at":NaN,"x":')
    with pytest.raises(InvalidPlanError):
        Plan.decode(raw)


def test_size_limit_on_encode_and_decode() -> None:
    big = {"pad": "x" * MAX_RECORD_BYTES}
    with pytest.raises(InvalidPlanError, match="over"):
        Plan.new({"a": 1}, kv_cache_memory_bytes=1, free_memory_baseline=1, producer=big).encode()
    with pytest.raises(InvalidPlanError, match="over"):
        Plan.decode(b" " * (MAX_RECORD_BYTES + 1))


def test_decode_checks_the_expected_key() -> None:
    plan = make_plan()
    assert Plan.decode(plan.encode(), expected_fingerprint=plan.fingerprint) == plan
    with pytest.raises(InvalidPlanError, match="key"):
        Plan.decode(plan.encode(), expected_fingerprint="f" * 64)


def test_plans_are_immutable() -> None:
    plan = make_plan()
    with pytest.raises(TypeError):
        plan.factors["model"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        plan.kv_cache_memory_bytes = 1  # type: ignore[misc]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
fields = st.sampled_from([*Plan.__dataclass_fields__, "extra"])


def _assert_rules(plan: Plan) -> None:
    assert plan.schema == 1
    assert type(plan.kv_cache_memory_bytes) is int and type(plan.free_memory_baseline) is int
    assert 0 < plan.kv_cache_memory_bytes <= plan.free_memory_baseline
    assert plan.fingerprint == hashlib.sha256(canonical(dict(plan.factors))).hexdigest()
    assert len(plan.encode()) <= MAX_RECORD_BYTES


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise_anything_else(raw: bytes) -> None:
    with contextlib.suppress(InvalidPlanError):
        _assert_rules(Plan.decode(raw))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(fields, json_values, max_size=8) | json_values)
def test_arbitrary_json_never_raises_anything_else(obj: Any) -> None:
    try:
        raw = orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return
    with contextlib.suppress(InvalidPlanError):
        _assert_rules(Plan.decode(raw))


scalars = (
    st.none()
    | st.booleans()
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=10), scalars, min_size=1, max_size=8),
    st.integers(min_value=1, max_value=2**63 - 1),
    st.integers(min_value=1, max_value=2**63 - 1),
)
def test_valid_records_round_trip(factors: dict[str, Any], a: int, b: int) -> None:
    kv, baseline = min(a, b), max(a, b)
    plan = Plan.new(factors, kv_cache_memory_bytes=kv, free_memory_baseline=baseline)
    decoded = Plan.decode(plan.encode(), expected_fingerprint=plan.fingerprint)
    assert decoded == plan
    _assert_rules(decoded)
