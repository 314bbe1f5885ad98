"""Terminal control characters in what a store holds (labels, producers, factors, invalid
records) or in what an endpoint answers never reach the terminal as such: every line the
command prints shows them escaped (``\\x1b``); JSON output escapes them as JSON does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from plancache import Plan, fingerprint, open_store
from plancache._keys import Scalar
from plancache._observation import Observation
from plancache.testing import GiB
from plancache.testing.hostile import FixedResponseServer
from tests.cli.helpers import run, write_raw

HOSTILE = "\x1b[2J\x1b]0;owned\x07\r\x9b31m\u202e\x00"
"""Clear screen, set the window title, bell, carriage return, an 8-bit CSI, a right-to-left
override and a NUL."""


def _printable(text: str) -> bool:
    return all(c == "\n" or c.isprintable() for c in text)


def _out(*args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, timeout=60)


def test_control_characters_are_escaped_in_every_line(tmp_path: Path) -> None:
    root = tmp_path / "store"
    factors: dict[str, Scalar] = {
        "model": f"m{HOSTILE}",
        "device_name": f"GPU{HOSTILE}",
        f"k{HOSTILE}": 1,
    }
    obs = Observation(GiB, 2 * GiB, 1.0, {"host": f"h{HOSTILE}", f"p{HOSTILE}": HOSTILE})
    plan = Plan(fingerprint(factors), factors, (obs,), {"model": HOSTILE, f"l{HOSTILE}": 1})
    open_store(str(root)).put(plan)
    bad = fingerprint({"model": "raw"})
    write_raw(root, bad, f'{{"schema": 2, "producer": "{HOSTILE}"'.encode())

    for shows, args in (
        (True, ["ls", str(root)]),
        (True, ["show", plan.fingerprint, "--url", str(root)]),
        (True, ["show", bad, "--url", str(root)]),
        (False, ["verify", str(root)]),
        (True, ["stats", str(root)]),
        (False, ["prune", "--dry-run", "--older-than", "1d", str(root)]),
    ):
        result = _out(*args)
        assert result.returncode in (0, 1), (args, result.stderr)
        assert _printable(result.stdout) and _printable(result.stderr), (args, result)
        assert not shows or "\\x1b[2J" in result.stdout, args
    for args in (["ls", "--json"], ["stats", "--json"]):
        out = _out(*args, str(root)).stdout
        assert all(c == "\n" or ord(c) >= 0x20 for c in out)
        json.loads(out)
    shown = json.loads(_out("show", "--json", plan.fingerprint, "--url", str(root)).stdout)
    assert shown["labels"]["model"] == HOSTILE  # the data itself is kept as it is


def test_control_characters_in_an_endpoint_error_are_escaped() -> None:
    body = json.dumps({"error": {"code": 403, "message": f"denied{HOSTILE}"}}).encode()
    with FixedResponseServer(403, body, {"Content-Type": "application/json"}) as server:
        options = json.dumps({"endpoint_url": server.endpoint, "token": "anon"})
        result = _out("ls", "gs://bucket/p", "--storage-options", options)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "denied\\x1b[2J" in result.stderr and _printable(result.stderr)
