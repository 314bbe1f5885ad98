"""``plancache cp``: every valid plan of one store into another, with merge semantics."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import orjson

from plancache import Plan, fingerprint, open_store
from plancache._keys import Scalar, plan_object_name
from plancache._merge import frontier
from plancache._observation import Observation
from plancache.testing import GiB, child_env
from tests.cli.helpers import (
    LocalFixture,
    fill,
    named_plan,
    observation,
    ok,
    record_bytes,
    run,
    write_raw,
)


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


def test_cp_merges_frontiers_and_upgrades_schema_1(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    factors: dict[str, Scalar] = {"model": "m", "device_name": "NVIDIA H100"}
    fp = fingerprint(factors)
    # no point dominates another: a lower baseline always comes with a smaller KV cache
    a, b, c = observation(9, 60, 3, "a"), observation(10, 65, 2, "b"), observation(11, 70, 1, "c")

    def put(root: Path, *points: Observation) -> None:
        open_store(str(root)).put(Plan(fp, factors, frontier(points), {"model": "m"}))

    put(src, a, b)
    put(dst, b, c)
    legacy_factors: dict[str, Scalar] = {"model": "old"}  # a record of plancache 0.1.0
    legacy = fingerprint(legacy_factors)
    write_raw(src, legacy, record_bytes(factors=legacy_factors))

    out = ok("cp", str(src), str(dst))
    assert out == f"copied {src} -> {dst}: 1 created, 1 replaced, 0 kept, 0 invalid skipped\n"
    merged = open_store(str(dst)).get(fp)
    assert merged is not None and merged.observations == (a, b, c)
    assert merged.labels == {"model": "m"}
    stored = orjson.loads((dst / plan_object_name(legacy)).read_bytes())
    assert stored["schema"] == 2 and len(stored["observations"]) == 1
    assert stored["observations"][0]["kv_cache_memory_bytes"] == GiB
    assert (src / plan_object_name(legacy)).read_bytes() == record_bytes(  # the source is untouched
        factors=legacy_factors, created_at=stored["observations"][0]["created_at"]
    )
    # copying again adds nothing
    assert "0 created, 0 replaced, 2 kept" in ok("cp", str(src), str(dst))


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
