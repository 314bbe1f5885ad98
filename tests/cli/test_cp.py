"""``plancache cp``: every valid plan of one store into another, with merge semantics."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from plancache import open_store
from plancache.testing import child_env
from tests.cli.helpers import LocalFixture, fill, named_plan, ok, run


def test_cp_merges(tmp_path: Path, store: LocalFixture) -> None:
    root, plans, _ = store
    dst = tmp_path / "new" / "dst"  # created on the first write
    out = ok("cp", str(root), str(dst))
    assert out == f"copied {root} -> {dst}: 3 created, 0 replaced, 0 kept, 1 invalid skipped\n"
    assert sorted(open_store(str(dst)).iter_fingerprints()) == sorted(p.fingerprint for p in plans)
    # DST holds a plan that dominates one of SRC's, and SRC a plan that dominates one of DST's
    better = named_plan("a", kv_gib=4, age_days=0)
    worse = named_plan("b", kv_gib=0.5, baseline_gib=60)
    open_store(str(root)).put(better)
    open_store(str(dst)).put(worse)  # kept: the stored one dominates
    out = ok("cp", str(root), str(dst))
    assert "0 created, 1 replaced, 2 kept, 1 invalid skipped" in out
    assert open_store(str(dst)).get(better.fingerprint) == better


def test_cp_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    src = tmp_path / "src"
    fill(src, 25)
    result = run("cp", str(src), str(tmp_path / "piped"))
    assert result.returncode == 0 and result.stderr == ""

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "plancache", "cp", str(src), str(tmp_path / "tty")],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=child_env(),
    )
    os.close(slave)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        stdout, _ = proc.communicate(timeout=60)
    finally:  # pytest-timeout may interrupt the read: never leave the command running
        os.close(master)
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 0
    assert b"copying [" in seen and b"] 25/25" in seen
    assert b"25 created" in stdout


def test_no_progress_bar_for_a_few_plans(tmp_path: Path) -> None:
    src = tmp_path / "src"
    fill(src, 3)
    master, slave = pty.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "plancache", "cp", str(src), str(tmp_path / "tty")],
            stdout=subprocess.PIPE,
            stderr=slave,
            env=child_env(),
            timeout=120,
        )
    finally:
        os.close(slave)
    try:
        os.set_blocking(master, False)
        try:
            seen = os.read(master, 4096)
        except (BlockingIOError, OSError):  # nothing written (or the terminal is gone)
            seen = b""
    finally:
        os.close(master)
    assert result.returncode == 0 and b"3 created" in result.stdout
    assert b"copying" not in seen
