"""Crash safety of the local store: writers killed with SIGKILL mid-write, readers reading."""

from __future__ import annotations

import multiprocessing
import random
import signal
import time
from pathlib import Path

import pytest

from plancache import InvalidPlanError
from plancache._backends.local import LocalStore
from plancache._store import PlanStore
from plancache.testing import GiB, make_plan
from tests.helpers import local_layer

KILLS = 50
KEYS = [make_plan(factors={"model": f"m{i}"}).fingerprint for i in range(3)]


def _writer(root: str, seed: int, ready: multiprocessing.synchronize.Event) -> None:
    """Write, replace and delete plans as fast as possible until killed."""
    store = PlanStore(LocalStore(root))
    rng = random.Random(seed)
    ready.set()
    while True:
        factors = {"model": f"m{rng.randrange(3)}"}
        plan = make_plan(rng.randint(1, 40) * GiB, rng.randint(40, 80) * GiB, factors)
        store.put(plan)
        if rng.random() < 0.3:
            store.delete(plan.fingerprint)


def _reader(
    root: str,
    stop: multiprocessing.synchronize.Event,
    out: multiprocessing.Queue[tuple[int, int, int]],
) -> None:
    """Read every key in a loop; report (reads, hits, invalid records seen)."""
    store = PlanStore(LocalStore(root))
    reads = hits = invalid = 0
    while not stop.is_set():
        for fp in KEYS:
            reads += 1
            try:
                hits += store.get(fp) is not None
            except InvalidPlanError:
                invalid += 1
    out.put((reads, hits, invalid))


@pytest.mark.slow
def test_sigkilled_writers_never_expose_a_torn_plan(tmp_path: Path) -> None:
    # forkserver, not fork: this process may hold threads (servers, background saves), and a
    # forked child could inherit a lock one of them held and hang
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    root = str(tmp_path)
    stop, out = ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(root, stop, out), daemon=True) for _ in range(2)]
    for r in readers:
        r.start()
    rng = random.Random(1)
    writer = None
    try:
        for i in range(KILLS):
            ready = ctx.Event()
            writer = ctx.Process(target=_writer, args=(root, i, ready), daemon=True)
            writer.start()
            assert ready.wait(10)
            time.sleep(rng.uniform(0.0, 0.03))
            writer.kill()
            writer.join(10)
            assert writer.exitcode == -signal.SIGKILL
        stop.set()
        results = [out.get(timeout=30) for _ in readers]
    finally:  # never leave a writer or reader running, whatever failed
        stop.set()
        for p in [*readers, *([writer] if writer else [])]:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)
    reads = sum(r[0] for r in results)
    hits = sum(r[1] for r in results)
    invalid = sum(r[2] for r in results)
    assert invalid == 0, f"{invalid} torn or invalid reads out of {reads}"
    assert reads > 1000 and hits > 0
    store = PlanStore(LocalStore(root))
    for fp in store.iter_fingerprints():
        assert store.get(fp) is not None
    left = local_layer(store).temp_files()
    print(f"reads={reads} hits={hits} temp files left by kills={len(left)}")
    assert store.layer.remove_stale_temp_files(older_than=0) == len(left)
    assert local_layer(store).temp_files() == []
