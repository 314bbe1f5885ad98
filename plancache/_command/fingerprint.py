"""``plancache fingerprint``: the key of a factors object, computed here; no store is opened."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from plancache._command.display import echo
from plancache._keys import canonical, fingerprint
from plancache.errors import CliError, InvalidPlanError


def cmd_fingerprint(args: argparse.Namespace) -> int:
    """Print the fingerprint and canonical encoding of the factors object in a file or on
    stdin (a whole plan record: of its factors); ``CliError`` for anything else."""
    name = args.factors
    label = "stdin" if name == "-" else name
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {label}: {exc.strerror or exc}") from None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{label} is not valid JSON: {exc}") from None
    if isinstance(obj, dict) and {"schema", "fingerprint", "factors"} <= obj.keys():
        obj = obj["factors"]  # a whole plan record, e.g. from `plancache show --json`
    if not isinstance(obj, dict):
        raise CliError(f"{label}: expected a JSON object of factors")
    try:
        encoding = canonical(obj)
    except InvalidPlanError as exc:
        raise CliError(f"{label}: {exc}") from None
    echo(fingerprint(obj))
    echo(encoding.decode())
    return 0
