"""The key: the frozen canonical encoding, key validation, key prefixes and object names."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from plancache import fingerprint
from plancache._keys import (
    OBJECT_PREFIX,
    OBJECT_SUFFIX,
    Scalar,
    canonical,
    fingerprint_of_name,
    is_key_prefix,
    plan_object_name,
    validate_key,
)
from plancache.testing import make_plan

FROZEN_FACTORS: dict[str, Scalar] = {
    "vllm": "0.33.0",
    "hash": "abc",
    "gpu_memory_utilization": 0.9,
    "rank": 0,
    "tp": 2,
    "eager": False,
    "note": None,
    "device": "NVIDIA H200",
    "big": 2**63,
}


def test_canonical_encoding_is_frozen() -> None:
    assert canonical({"a": 1}) == b'{"a":1}'
    assert fingerprint({"a": 1}) == hashlib.sha256(b'{"a":1}').hexdigest()
    assert canonical(FROZEN_FACTORS) == (
        b'{"big":9223372036854775808,"device":"NVIDIA H200","eager":false,'
        b'"gpu_memory_utilization":0.9,"hash":"abc","note":null,"rank":0,"tp":2,"vllm":"0.33.0"}'
    )
    assert (
        fingerprint(FROZEN_FACTORS)
        == "d387bc61a6afe88ba3acd371780fd7b4b6ace1213bbaccdfc8210c046ac731d2"
    )


def test_key_order_does_not_matter() -> None:
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 1.0})
    assert fingerprint({"a": 1}) != fingerprint({"a": True})


@pytest.mark.parametrize(
    "factors",
    [
        {},
        {"a": float("nan")},
        {"a": math.inf},
        {"a": [1]},
        {"a": {"b": 1}},
        {1: "a"},
        {"a": 2**64},
        {"a": -(2**63) - 1},
        {"a": b"bytes"},
        {"a": type("Float64", (float,), {})(1.5)},
        {"a": type("Name", (str,), {})("x")},
        ["a"],
        None,
    ],
)
def test_unencodable_factors_are_value_errors(factors: Any) -> None:
    with pytest.raises(ValueError):
        fingerprint(factors)


def test_validate_key() -> None:
    fp = "0" * 64
    assert validate_key(fp) == fp
    for bad in ["0" * 63, "0" * 64 + "\n", "../" + "0" * 61, "F" * 64, 0, None]:
        with pytest.raises(ValueError):
            validate_key(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        *[("0", True), ("abc123", True), ("f" * 64, True)],
        *[("", False), ("f" * 65, False), ("ABC", False), ("xyz", False), ("ab cd", False)],
        *[("ab\n", False), ("../a", False)],
    ],
)
def test_is_key_prefix(text: str, expected: bool) -> None:
    assert is_key_prefix(text) is expected


def test_object_names_round_trip() -> None:
    fp = make_plan().fingerprint
    name = plan_object_name(fp)
    assert name == f"startup_plan_{fp}.json" == f"{OBJECT_PREFIX}{fp}{OBJECT_SUFFIX}"
    assert fingerprint_of_name(name) == fp


@pytest.mark.parametrize(
    "name",
    [
        "notes.txt",
        "startup_plan_zz.json",
        "startup_plan_" + "A" * 64 + ".json",
        "startup_plan_" + "a" * 63 + ".json",
        "startup_plan_" + "a" * 64 + ".json.tmp",
        ".startup_plan_" + "a" * 64 + ".json",
        "startup_plan_" + "a" * 64,
    ],
)
def test_other_names_carry_no_key(name: str) -> None:
    assert fingerprint_of_name(name) is None
