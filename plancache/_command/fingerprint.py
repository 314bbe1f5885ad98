"""``plancache fingerprint``: the key of a factors object, computed here; no store is opened.
And how every command reads a factors file (``read_factors``)."""

from __future__ import annotations

import argparse
import sys
from typing import cast

import orjson

from plancache._command.display import echo
from plancache._keys import Scalar, canonical, fingerprint
from plancache.errors import CliError, InvalidPlanError

MAX_FACTORS_BYTES = 1 << 20
"""Most bytes read of a factors file (a plan record's factors are far smaller)."""


def read_factors(name: str) -> tuple[dict[str, Scalar], dict[str, object]]:
    """(factors, labels) of the JSON in file ``name`` (``-``: stdin): a factors object, a
    whole plan record (``show --json``: its factors and labels), or what the vLLM plugin
    writes on a miss (``{"factors": ..., "labels": ...}``); ``CliError`` for anything else."""
    label = "stdin" if name == "-" else name
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_FACTORS_BYTES + 1)
        else:
            with open(name, "rb") as f:
                data = f.read(MAX_FACTORS_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read {label}: {exc.strerror or exc}") from None
    if len(data) > MAX_FACTORS_BYTES:
        raise CliError(f"{label} is over {MAX_FACTORS_BYTES} bytes: not a factors object")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{label} is not valid JSON: {exc}") from None
    labels: object = {}
    if isinstance(obj, dict) and isinstance(obj.get("factors"), dict):
        labels = obj.get("labels", {})  # a whole record, or the plugin's file of a miss
        obj = obj["factors"]
    if not isinstance(obj, dict) or not isinstance(labels, dict):
        raise CliError(f"{label}: expected a JSON object of factors")
    try:
        canonical(obj)  # every value a scalar, every key a str
    except InvalidPlanError as exc:
        raise CliError(f"{label}: {exc}") from None
    return cast("dict[str, Scalar]", obj), labels


def cmd_fingerprint(args: argparse.Namespace) -> int:
    """Print the fingerprint and canonical encoding of the factors object in a file or on
    stdin (a whole plan record: of its factors); ``CliError`` for anything else."""
    factors, _ = read_factors(args.factors)
    echo(fingerprint(factors))
    echo(canonical(factors).decode())
    return 0
