"""The rank agreement over a real gloo group: one stand-in worker per rank, each in its own
process (needs torch: ``tox -e vllm``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import plancache.integrations.vllm as plugin
from plancache import Plan, open_store
from plancache.integrations.vllm.factors import as_scalars
from plancache.testing import GiB, child_env
from tests.vllm.support import GLOO_RANK, REPO

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (tox -e vllm)"
)


def _boot_ranks(
    store: Path,
    rendezvous: Path,
    free: list[int],
    timeout: float = 30.0,
    idle: frozenset[int] = frozenset(),
    explicit: frozenset[int] = frozenset(),
) -> list[dict[str, object]]:
    """Boot one stand-in worker per rank in its own process (gloo); their JSON reports."""
    env = child_env([REPO], PLANCACHE_URL=str(store), GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(GLOO_RANK),
                str(rank),
                str(len(free)),
                str(rendezvous),
                str(mem),
                str(timeout),
                *(["idle"] if rank in idle else []),
                *(["explicit"] if rank in explicit else []),
            ],
            env=env,
            cwd=rendezvous.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, mem in enumerate(free)
    ]
    reports = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr
            reports.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports


def _marks(store: Path) -> list[Path]:
    """Crash marks the ranks left in the local store."""
    return list((store / "marks").glob("*.mark"))


def _seed(store: Path, gpu: ModuleType, rank: int, world: int, baseline: int) -> None:
    """A 20 GiB plan for ``rank`` recorded at ``baseline`` free bytes."""
    worker = gpu.Worker(rank=rank, world_size=world)
    plan = Plan.new(
        as_scalars(plugin.worker_factors(worker)),
        kv_cache_memory_bytes=20 * GiB,
        free_memory_baseline=baseline,
    )
    open_store(str(store)).put(plan)


def test_ranks_apply_together(gpu: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "both-pass"
    _seed(store, gpu, 0, 2, baseline=60 * GiB)
    _seed(store, gpu, 1, 2, baseline=60 * GiB)
    reports = _boot_ranks(store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB])
    assert all("memory-profiling" not in r["events"] for r in reports)  # type: ignore[operator]
    assert [r["kv"] for r in reports] == [20 * GiB, 20 * GiB]
    assert [r["next_collective"] for r in reports] == [3, 3]
    assert [r["marked"] for r in reports] == [True, True]
    assert _marks(store) == []  # removed after the warm-up


def test_one_gate_fails_so_no_rank_applies(gpu: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "one-passes"
    _seed(store, gpu, 0, 2, baseline=60 * GiB)
    _seed(store, gpu, 1, 2, baseline=90 * GiB)  # rank 1 has only 80 GiB free
    reports = _boot_ranks(store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB])
    assert all("memory-profiling" in r["events"] for r in reports)  # type: ignore[operator]
    assert [r["marked"] for r in reports] == [False, False]  # rank 0's removed after the vote


def test_failed_agreement_stops_the_boot(gpu: ModuleType, tmp_path: Path) -> None:
    """A peer that never votes: the vote waits the group's own timeout (no shorter one of
    ours), then the boot stops with a clear error instead of going on alone."""
    store = tmp_path / "peer-absent"
    _seed(store, gpu, 0, 2, baseline=60 * GiB)
    rank0, _idle = _boot_ranks(
        store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB], timeout=3.0, idle=frozenset({1})
    )
    assert "could not agree" in rank0["error"]  # type: ignore[operator]
    assert 2.5 < rank0["seconds"] < 30  # type: ignore[operator]
    assert _marks(store) == []  # nothing applied: no mark to read as a crash


def test_explicit_rank_votes_and_peers_apply(gpu: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "explicit"
    _seed(store, gpu, 1, 2, baseline=60 * GiB)
    reports = _boot_ranks(
        store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB], explicit=frozenset({0})
    )
    assert all("memory-profiling" not in r["events"] for r in reports)  # type: ignore[operator]
    assert [r["kv"] for r in reports] == [7 * GiB, 20 * GiB]
    assert [r["next_collective"] for r in reports] == [3, 3]


@pytest.mark.skipif(
    not os.environ.get("PLANCACHE_SOAK"), reason="a soak: set PLANCACHE_SOAK=N to boot N pairs"
)
def test_ranks_end_cleanly_under_load(gpu: ModuleType, tmp_path: Path) -> None:
    """Every rank process exits 0 in N boots of two ranks with a busy process beside them
    (before ``gloo_rank.exit_now``, about 1 in 50 ranks ended in SIGABRT at exit)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for n in range(int(os.environ["PLANCACHE_SOAK"])):
            store = tmp_path / f"soak-{n}"
            for rank in (0, 1):
                _seed(store, gpu, rank, 2, baseline=60 * GiB if n % 2 else 90 * GiB)
            _boot_ranks(store, tmp_path / f"rendezvous-{n}", [80 * GiB, 80 * GiB])
    finally:
        busy.kill()
        busy.wait()
