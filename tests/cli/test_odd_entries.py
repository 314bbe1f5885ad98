"""Odd local entries named like a plan (real FIFOs, sockets, directories and symbolic links):
every command reports each on its own line as an invalid entry, never hangs on one, and the
rest of the store works; ``verify --fix`` removes what it reports."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import fingerprint, open_store
from plancache._keys import plan_object_name
from tests.cli.helpers import named_plan, run
from tests.helpers import ODD_ENTRIES, plant_odd_entry

VALID = named_plan("valid")
ODD_FP = fingerprint({"model": "odd"})
COMMAND_BOUND_S = 30.0


WORDS = {
    "fifo": "is a FIFO",
    "socket": "is a socket",
    "directory": "is a directory",
    "dangling-symlink": "is a symbolic link",
    "symlink-loop": "is a symbolic link",
    "symlink-to-a-plan": "is a symbolic link",
}
"""The words that name each kind of odd entry."""


def plancache(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m plancache ARGS``, which must end within ``COMMAND_BOUND_S``."""
    return run(*args, timeout=COMMAND_BOUND_S)


@pytest.fixture(params=ODD_ENTRIES)
def odd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A local store with one valid plan and one odd entry named like a plan; its root and
    the words that name the entry's kind."""
    root = tmp_path / "store"
    open_store(str(root)).put(VALID)
    plant_odd_entry(request.param, root / plan_object_name(ODD_FP), named_plan("odd"))
    yield root, WORDS[request.param]


def test_every_command_reports_an_odd_entry_and_works_on(
    odd: tuple[Path, str], tmp_path: Path
) -> None:
    root, words = odd
    entry = root / plan_object_name(ODD_FP)

    ls = plancache("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    assert VALID.fingerprint[:12] in ls.stdout
    [line] = [x for x in ls.stdout.splitlines() if ODD_FP[:12] in x]
    assert words in line
    assert ls.stdout.splitlines()[-1].startswith("1 plan, 1 invalid, in ")

    verify = plancache("verify", str(root))
    assert verify.returncode == 1, verify.stderr
    [line] = [x for x in verify.stdout.splitlines() if x.startswith(ODD_FP)]
    assert words in line
    assert "2 records checked" in verify.stdout and ": 1 invalid" in verify.stdout

    stats = plancache("stats", str(root))
    assert stats.returncode == 0, stats.stderr
    assert "plans    1 (1 invalid)" in stats.stdout

    show = plancache("show", ODD_FP[:12], "--url", str(root))
    assert show.returncode == 1 and show.stdout == ""
    assert show.stderr.count("\n") == 1 and words in show.stderr
    assert plancache("show", VALID.fingerprint[:12], "--url", str(root)).returncode == 0

    cp = plancache("cp", str(root), str(tmp_path / "copy"))
    assert cp.returncode == 0, cp.stderr
    assert "1 created, 0 replaced, 0 kept, 1 invalid skipped" in cp.stdout

    prune = plancache("prune", "--older-than", "1d", str(root))
    assert prune.returncode == 0, prune.stderr
    assert "1 invalid record left" in prune.stdout

    fix = plancache("verify", "--fix", str(root))
    assert fix.returncode == 0, fix.stderr
    [line] = [x for x in fix.stdout.splitlines() if x.startswith(ODD_FP)]
    assert words in line and line.endswith("(deleted)")
    assert not os.path.lexists(entry)
    if (tmp_path / "outside.json").exists():
        assert (tmp_path / "outside.json").stat().st_size > 0  # a link's target is kept
    again = plancache("verify", str(root))
    assert again.returncode == 0 and "1 record checked" in again.stdout
    assert open_store(str(root)).get(VALID.fingerprint) == VALID


def test_a_stale_temp_directory_does_not_fail_prune(tmp_path: Path) -> None:
    root = tmp_path / "store"
    open_store(str(root)).put(VALID)
    stale = root / f".{plan_object_name(VALID.fingerprint)}.host.1.abcd.x.tmp"
    stale.mkdir()
    (stale / "inside").write_text("x")
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    prune = plancache("prune", "--older-than", "1d", str(root))
    assert prune.returncode == 0, prune.stderr
    assert "0 abandoned temp files" in prune.stdout
    assert stale.is_dir()  # never written by plancache: left alone
    assert plancache("ls", str(root)).returncode == 0
