"""What several test modules share: odd entries named like a plan in a local store (real
FIFOs, sockets, directories and symbolic links), a call bounded in time, the crash mark
of a real process that died, and the loose time bounds of tests that set none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from plancache import Plan, PlanStore
from plancache._backends._remote import CallTimeouts
from plancache._backends.local import LocalStore
from plancache._observation import Observation
from plancache.testing import child_env

T = TypeVar("T")

LOOSE_BOUNDS = CallTimeouts(connect=5.0, read=10.0, retries=1, total=30.0)
"""The per-call bounds of a remote store opened in a test that sets none (``conftest.py``)."""
LOOSE_BUDGET_S = 30.0
"""The lookup and record budget of a ``PlanCache``, and the wait of a ``LazyStore`` for its
client to open, in a test that sets none."""
LOOSE_OPTIONS: dict[str, float] = {
    name: getattr(LOOSE_BOUNDS, field) for name, field in CallTimeouts.OPTIONS.items()
}
"""``LOOSE_BOUNDS`` as storage options, for the remote stores of child processes."""


def _socket(path: Path, plan: Plan) -> None:
    cwd = os.getcwd()
    os.chdir(path.parent)  # a relative name: the full path may be over AF_UNIX's 108 bytes
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(cwd)


def _directory(path: Path, plan: Plan) -> None:
    path.mkdir()
    (path / "inside").write_text("x")


def _link_to_a_plan(path: Path, plan: Plan) -> None:
    outside = path.parent.parent / "outside.json"
    outside.write_bytes(plan.encode())
    path.symlink_to(outside)


_PLANT: dict[str, Callable[[Path, Plan], None]] = {
    "dangling-symlink": lambda path, plan: path.symlink_to(path.parent.parent / "nowhere"),
    "directory": _directory,
    "fifo": lambda path, plan: os.mkfifo(path),
    "socket": _socket,
    "symlink-loop": lambda path, plan: path.symlink_to(path),
    "symlink-to-a-plan": _link_to_a_plan,
}
ODD_ENTRIES = tuple(_PLANT)
"""The kinds of entry ``plant_odd_entry`` makes."""


def plant_odd_entry(kind: str, path: Path, plan: Plan) -> None:
    """Make ``path``, in a store's root, an entry of ``kind`` that is no regular file: a
    symbolic link to nothing, a directory (with a file in it), a FIFO, a socket, a link to
    itself, or a link to ``outside.json`` next to the root, which holds ``plan``'s record."""
    _PLANT[kind](path, plan)


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``'s result or exception, failing the test if it takes over ``seconds`` (``fn``
    runs in a daemon thread, left behind when it does)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def dead_mark(marks: Path, fingerprint: str, observation: Observation) -> Path:
    """The crash mark that a boot which died with ``observation`` of ``fingerprint`` applied
    left in the directory ``marks``: armed by a real process that then exits, its lock
    released by the kernel, without removing it."""
    code = (
        "import sys, orjson\n"
        "from plancache._breaker import Breaker\n"
        "from plancache._observation import Observation\n"
        "o = Observation.from_dict(orjson.loads(sys.argv[3]))\n"
        "print(Breaker(sys.argv[1]).arm(sys.argv[2], o).path)\n"
    )
    data = observation.encode().decode()
    done = subprocess.run(
        [sys.executable, "-c", code, str(marks), fingerprint, data],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def local_layer(store: PlanStore) -> LocalStore:
    """The local directory ``store``'s plans are kept in (a test's own local store)."""
    layer = store.layer
    assert isinstance(layer, LocalStore), layer
    return layer
