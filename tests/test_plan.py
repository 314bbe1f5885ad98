"""The record format: validation rules, and decode on hostile input (the key and its
encoding: test_fingerprint.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancache import InvalidPlanError, Plan, fingerprint
from plancache._keys import canonical
from plancache._observation import Observation, Tombstone
from plancache._plan import MAX_RECORD_BYTES
from plancache._signing import Keyring
from plancache.testing import GiB, make_plan


def test_round_trip_and_unknown_fields_ignored() -> None:
    plan = make_plan()
    assert Plan.decode(plan.encode()) == plan
    extended = orjson.loads(plan.encode()) | {"future_field": [1, 2, 3]}
    assert Plan.decode(orjson.dumps(extended)) == plan


def test_decode_builds_what_the_constructors_build() -> None:
    """decode sets every field at once (``observation.build``), not through ``__init__``: the
    result holds every field, equals and hashes like the constructed record, and is frozen."""
    plain = make_plan(kv=2 * GiB, baseline=4 * GiB)
    gone = make_plan(kv=3 * GiB, baseline=5 * GiB).observations[0]
    with_tomb = Plan(
        plain.fingerprint, plain.factors, plain.observations, retracted=(Tombstone.of(gone, 1.0e9),)
    )
    signed = Keyring(signing_key="k" * 32).sign(with_tomb)
    for plan in (plain, with_tomb, signed):
        decoded = Plan.decode(plan.encode())
        assert set(vars(decoded)) == {f.name for f in dataclasses.fields(Plan)}
        assert decoded == plan and decoded.signature == plan.signature
        obs = decoded.observations[0]
        assert set(vars(obs)) == {f.name for f in dataclasses.fields(Observation)}
        assert hash(obs) == hash(plan.observations[0])
        with pytest.raises(dataclasses.FrozenInstanceError):
            decoded.schema = 1  # type: ignore[misc]
        assert type(decoded.factors).__name__ == "mappingproxy"


_OBSERVATION_FIELDS = {"kv_cache_memory_bytes", "free_memory_baseline", "created_at", "producer"}


def _record(**changes: Any) -> bytes:
    """A valid record with ``changes`` applied (observation fields to its one observation)."""
    data = orjson.loads(make_plan().encode())
    for k, v in changes.items():
        target = data["observations"][0] if k in _OBSERVATION_FIELDS else data
        if v is _DELETE:
            del target[k]
        else:
            target[k] = v
    return orjson.dumps(data)


_DELETE = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema": 3}, "schema 3"),
        ({"schema": _DELETE}, "schema"),
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
        ({"created_at": 1e300}, "created_at"),
        ({"created_at": 253402300800}, "created_at"),
        ({"created_at": -1}, "created_at"),
        ({"producer": "me"}, "producer"),
        ({"producer": {"pad": "x" * 2000}}, "producer"),
        ({"factors": _DELETE}, "lacks"),
        ({"observations": _DELETE}, "lacks"),
        ({"observations": []}, "1..32"),
        ({"observations": {}}, "array"),
        ({"created_at": _DELETE}, "observation lacks"),
        ({"labels": {"model": "x" * 300}}, "label"),
        ({"labels": {f"l{i}": i for i in range(17)}}, "labels"),
        ({"labels": []}, "labels"),
    ],
)
def test_decode_rejects_rule_breakers(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        Plan.decode(_record(**changes))


@pytest.mark.parametrize("raw", [b"NaN", b"[1]", b'"x"', b"", b"{", b"\x00" * 10])
def test_decode_rejects_non_records(raw: bytes) -> None:
    with pytest.raises(InvalidPlanError):
        Plan.decode(raw)


def test_a_record_that_is_not_a_frontier_is_invalid() -> None:
    data = orjson.loads(make_plan().encode())
    point = data["observations"][0]
    dominated = point | {"kv_cache_memory_bytes": point["kv_cache_memory_bytes"] - 1}
    for observations in ([point, point], [point, dominated], [dominated, point]):
        with pytest.raises(InvalidPlanError, match="frontier"):
            Plan.decode(orjson.dumps(data | {"observations": observations}))


def test_duplicate_keys_are_invalid() -> None:
    raw = make_plan().encode()
    with pytest.raises(InvalidPlanError, match="duplicate"):
        Plan.decode(raw[:-1] + b',"schema":2}')
    inner = raw.replace(b'"created_at":', b'"created_at":1.0,"created_at":', 1)
    with pytest.raises(InvalidPlanError, match="duplicate"):
        Plan.decode(inner)
    for blank in (b" ", b"\t", b"\n", b"\r"):  # blanks before a colon hide no repeat
        spaced = raw[:-1] + b',"schema"' + blank + b":2}"
        with pytest.raises(InvalidPlanError, match="duplicate"):
            Plan.decode(spaced)
    pretty = orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2)
    assert Plan.decode(pretty) == Plan.decode(raw)  # whitespace alone is valid JSON


def test_a_schema_1_record_reads_as_a_one_point_frontier() -> None:
    legacy = {
        "schema": 1,
        "fingerprint": fingerprint({"a": 1}),
        "factors": {"a": 1},
        "kv_cache_memory_bytes": 10 * GiB,
        "free_memory_baseline": 70 * GiB,
        "created_at": 1.7e9,
        "producer": {"host": "old"},
    }
    plan = Plan.decode(orjson.dumps(legacy))
    assert plan.schema == 1 and len(plan.observations) == 1
    assert (plan.max_kv_cache_memory_bytes, plan.min_free_memory_baseline) == (10 * GiB, 70 * GiB)
    assert plan.newest is not None and plan.newest.producer == {"host": "old"}
    assert plan.labels == {}
    assert orjson.loads(plan.encode())["schema"] == 2  # written back as schema 2
    with pytest.raises(InvalidPlanError, match="lacks"):
        Plan.decode(orjson.dumps({k: v for k, v in legacy.items() if k != "created_at"}))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("kv_cache_memory_bytes", "max_kv_cache_memory_bytes"),
        ("free_memory_baseline", "min_free_memory_baseline"),
    ],
)
def test_the_frontiers_extremes_and_their_deprecated_names(old: str, new: str) -> None:
    """The largest KV and the lowest baseline come from different observations; the old
    names return the same values and warn, pointing at the caller."""
    low = Observation(
        kv_cache_memory_bytes=8 * GiB, free_memory_baseline=60 * GiB, created_at=1.7e9
    )
    high = Observation(
        kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB, created_at=1.7e9
    )
    plan = Plan(fingerprint({"a": 1}), {"a": 1}, (low, high))
    assert (plan.max_kv_cache_memory_bytes, plan.min_free_memory_baseline) == (10 * GiB, 60 * GiB)
    with pytest.warns(
        DeprecationWarning,
        match=f"^Plan.{old} is deprecated: use Plan.{new} \\(removed in plancache 0.6.0\\)$",
    ) as w:
        value = getattr(plan, old)
    assert value == getattr(plan, new)
    assert [x.filename for x in w] == [__file__]


def test_labels_are_not_part_of_the_key() -> None:
    a = Plan.new({"a": 1}, kv_cache_memory_bytes=1, free_memory_baseline=2, labels={"m": "x"})
    b = Plan.new({"a": 1}, kv_cache_memory_bytes=1, free_memory_baseline=2)
    assert a.fingerprint == b.fingerprint and a.labels == {"m": "x"}
    assert Plan.decode(a.encode()).labels == {"m": "x"}


def test_nan_in_the_body_is_invalid() -> None:
    raw = make_plan().encode().replace(b'"created_at":', b'"created_at":NaN,"x":')
    with pytest.raises(InvalidPlanError):
        Plan.decode(raw)


def test_size_limit_on_encode_and_decode() -> None:
    big = {"a": "x" * MAX_RECORD_BYTES}
    with pytest.raises(InvalidPlanError, match="over"):
        Plan.new(big, kv_cache_memory_bytes=1, free_memory_baseline=1).encode()
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
        plan.observations = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        plan.observations[0].kv_cache_memory_bytes = 1  # type: ignore[misc]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
fields = st.sampled_from([*Plan.__dataclass_fields__, *Observation.__dataclass_fields__, "extra"])


def _assert_rules(plan: Plan) -> None:
    assert plan.schema in (1, 2)
    for o in plan.observations:
        assert type(o.kv_cache_memory_bytes) is int and type(o.free_memory_baseline) is int
        assert 0 < o.kv_cache_memory_bytes <= o.free_memory_baseline
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


def test_duplicate_json_keys_are_rejected() -> None:
    data = make_plan().encode()
    top = data[:-1] + b',"schema":2}'
    with pytest.raises(InvalidPlanError, match="duplicate"):
        Plan.decode(top)
    inner = data.replace(b'"producer":{', b'"producer":{"host":"a","host":"b",')
    with pytest.raises(InvalidPlanError, match="duplicate"):
        Plan.decode(inner)
    assert Plan.decode(data).fingerprint == make_plan().fingerprint
    tricky = data.replace(b'"producer":{', b'"producer":{"note":"a\\":b \\" :c",')
    assert Plan.decode(tricky).observations[0].producer["note"] == 'a":b " :c'  # valid


@pytest.mark.parametrize("created_at", [1e300, 253402300800.0, -1.0, 1e17])
def test_created_at_is_bounded_by_the_format(created_at: float) -> None:
    record = json.loads(make_plan().encode())
    record["observations"][0]["created_at"] = created_at
    with pytest.raises(InvalidPlanError, match="created_at"):
        Plan.decode(json.dumps(record).encode())
