"""Write contention: many writers put one observation each under one key at the same moment.

Every writer waits for a common start time, then calls ``put`` once. Per put: the requests
it sent (the store's primitive calls, one HTTP request each on S3 and GCS; transport retries
inside a call are not counted) and its seconds; then whether it gave up, and whether any
written observation is lost: neither in the final frontier nor dominated by a point of it.

Workloads (both keep "lost" well defined under the frontier's bound of 32 points):

- ``fleet``: free memory 130 GiB ±2 GiB, KV 100 GiB ±64 MiB, drawn per writer (the fleet
  benchmark's spread): most points end up dominated.
- ``distinct``: at most 32 mutually non-dominated points (a staircase); writer ``i`` writes
  point ``i % 32``, less ``i // 32`` MiB of KV (dominated by the full point). Up to 32
  writers every write is needed.

Back ends: ``local`` (a directory), ``s3`` (moto), ``gcs`` (fake-gcs-server): the writers
are threads of a few processes, each process with one store object, opened before the start
(an S3 client takes about a second of CPU to open here); ``sim``: the real merge loop on
in-process stores, one per writer, whose every primitive call sleeps ``latency`` seconds
(threads; many writers on a small machine).

Run: ``python -m benchmarks.contention [--writers 16 64] [--backends local s3 gcs sim]``
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import multiprocessing
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from benchmarks.console import log_to_stderr
from benchmarks.report import contention_table
from plancache import Plan, PlanStore, open_store
from plancache._keys import Scalar
from plancache._merge import covers
from plancache._objects import CREATE, Opened, Update, WriteMode
from plancache._observation import Observation
from plancache._store import content_version
from plancache.errors import PlanStoreError
from plancache.testing import GiB
from plancache.testing.servers import gcs_server, s3_server

MiB = 1 << 20
FACTORS: dict[str, Scalar] = {"model": "contention/bench", "rank": 0}
PRIMITIVES = ("read_object", "write_object", "delete_object")
"""The object layer's calls that send a request (one each on an object store)."""
WORKLOADS = ("fleet", "distinct")
SUITE: dict[str, list[int]] = {"sim": [16, 64, 256], "local": [16, 64], "s3": [64], "gcs": [64]}
"""Writer counts per back end in the main benchmark (``python -m benchmarks``)."""
START_DELAY_S = 1.0
"""Seconds between the last writer's warm-up and the common start."""

Point = tuple[int, int]
"""(kv_cache_memory_bytes, free_memory_baseline)"""
Opener = Callable[[], PlanStore]


def points(workload: str, n: int, seed: int = 0) -> list[Point]:
    """The observation each of ``n`` writers puts (see the module docstring)."""
    if workload == "fleet":
        rng = random.Random(seed)
        return [
            (100 * GiB + rng.randint(-64, 64) * MiB, 130 * GiB + rng.randint(-2048, 2048) * MiB)
            for _ in range(n)
        ]
    if workload == "distinct":
        return [((1 + i % 32) * GiB - (i // 32) * MiB, (40 + i % 32) * GiB) for i in range(n)]
    raise ValueError(f"unknown workload {workload!r}")


def _plan(point: Point) -> Plan:
    kv, baseline = point
    return Plan.new(FACTORS, kv_cache_memory_bytes=kv, free_memory_baseline=baseline)


def counted(store: PlanStore) -> Counter[int]:
    """Count ``store``'s object-layer calls from now on, per thread."""
    calls: Counter[int] = Counter()

    def counting(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            calls[threading.get_ident()] += 1
            return fn(*args)

        return call

    for name in PRIMITIVES:
        if hasattr(store, name):
            setattr(store, name, counting(getattr(store, name)))
    return calls


def _put(store: PlanStore, calls: Counter[int], point: Point, start_at: float) -> dict[str, Any]:
    """Wait for ``start_at`` (wall clock), put ``point``: requests, seconds, outcome."""
    time.sleep(max(0.0, start_at - time.time()))
    start = time.perf_counter()
    try:
        outcome = store.put(_plan(point)).value
    except PlanStoreError as exc:
        outcome = f"error: {type(exc).__name__}"
    seconds = time.perf_counter() - start
    return {"requests": calls[threading.get_ident()], "seconds": seconds, "outcome": outcome}


def _threads(fn: Callable[[int], dict[str, Any]], items: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{} for _ in items]

    def run(k: int) -> None:
        out[k] = fn(items[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _process(
    opener: Opener, batch: list[tuple[int, Point]], ready: Any, start: Any
) -> list[tuple[int, dict[str, Any]]]:
    """One process's writers: threads sharing one store, opened before the start."""
    store = opener()
    store.get("0" * 64)  # opens the client: the put's time is the put's alone
    calls = counted(store)
    ready.release()
    start_at = start.get()
    results = _threads(lambda k: _put(store, calls, batch[k][1], start_at), list(range(len(batch))))
    store.close()
    return [(i, r) for (i, _), r in zip(batch, results, strict=True)]


def contend(opener: Opener, pts: list[Point], processes: int) -> list[dict[str, Any]]:
    """Every point put by its own writer, the writers spread over ``processes`` processes
    (spawned); the writers' results in point order."""
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    ready, start = manager.Semaphore(0), manager.Queue()
    batches = [[(i, p) for i, p in enumerate(pts) if i % processes == k] for k in range(processes)]
    with ctx.Pool(processes, initializer=log_to_stderr) as pool:
        pending = pool.starmap_async(_process, [(opener, b, ready, start) for b in batches])
        for _ in range(processes):
            ready.acquire(timeout=120)
        start_at = time.time() + START_DELAY_S
        for _ in range(processes):
            start.put(start_at)
        done = pending.get(timeout=600)
    manager.shutdown()
    return [r for _, r in sorted((i, r) for batch in done for i, r in batch)]


def summary(results: list[dict[str, Any]], final: Plan | None, pts: list[Point]) -> dict[str, Any]:
    """Requests and seconds per put (p50, p99, max), gave-ups and lost observations."""
    requests = sorted(r["requests"] for r in results)
    seconds = sorted(r["seconds"] for r in results)

    def rank(values: list[Any], q: float) -> Any:
        return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))]

    frontier = () if final is None else final.observations
    lost = [p for p in pts if not covers(frontier, Observation(p[0], p[1], 0.0, {}))]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    return {
        "writers": len(results),
        "requests": {
            "p50": statistics.median(requests),
            "p99": rank(requests, 0.99),
            "max": requests[-1],
        },
        "seconds": {
            "p50": round(statistics.median(seconds), 4),
            "p99": round(rank(seconds, 0.99), 4),
            "max": round(seconds[-1], 4),
        },
        "outcomes": outcomes,
        "gave_up": sum(r["outcome"].startswith("error") for r in results),
        "lost": len(lost),
        "frontier_points": len(frontier),
    }


# -- the simulated store ------------------------------------------------------------------------
class _Records:
    """The records of a simulated store, shared by every writer's ``LatencyStore``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, bytes] = {}


class LatencyStore(PlanStore):
    """An in-process store whose every primitive call first sleeps ``latency`` seconds (a
    round trip); create, replace and delete are atomic under one lock."""

    def __init__(self, records: _Records, latency: float) -> None:
        self.records = records
        self.latency = latency

    @property
    def url(self) -> str:
        return "sim://"

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        time.sleep(self.latency)
        data = self.records.data.get(name)
        return None if data is None else (data[:limit], content_version(data))

    def open_object(self, name: str) -> Opened | None:
        found = self.read_object(name, 1 << 30)
        return None if found is None else Opened(io.BytesIO(found[0]), found[1])

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        data = b"".join(chunks)
        time.sleep(self.latency)
        with self.records.lock:
            current = self.records.data.get(name)
            if isinstance(mode, Update):
                if current is None or content_version(current) != mode.version:
                    return False
            elif current is not None:
                return False
            self.records.data[name] = data
            return True

    def delete_object(self, name: str, version: object | None = None) -> bool:
        time.sleep(self.latency)
        with self.records.lock:
            current = self.records.data.get(name)
            if current is None or (version is not None and content_version(current) != version):
                return False
            del self.records.data[name]
            return True

    def list_objects(self, prefix: str) -> Iterator[str]:
        return iter(sorted(n for n in list(self.records.data) if n.startswith(prefix)))


def simulate(pts: list[Point], latency: float) -> dict[str, Any]:
    """The writers as threads of this process on ``LatencyStore``s (the real merge loop)."""
    records = _Records()
    stores = [LatencyStore(records, latency) for _ in pts]
    calls = [counted(s) for s in stores]
    start_at = time.time() + 0.2
    results = _threads(lambda i: _put(stores[i], calls[i], pts[i], start_at), list(range(len(pts))))
    return summary(results, LatencyStore(records, 0).get(_plan(pts[0]).fingerprint), pts)


# -- the benchmark -------------------------------------------------------------------------------
def measure_backend(
    backend: str, writers: int, workload: str, processes: int, latency: float
) -> dict[str, Any]:
    """One contention run: ``writers`` writers of ``workload`` on ``backend``."""
    pts = points(workload, writers)
    if backend == "sim":
        return simulate(pts, latency) | {"latency_s": latency}
    with ExitStack() as stack:
        if backend == "local":
            opener: Opener = functools.partial(
                open_store, stack.enter_context(tempfile.TemporaryDirectory())
            )
        else:
            server = s3_server() if backend == "s3" else gcs_server()
            url, options = stack.enter_context(server)
            opener = functools.partial(open_store, url, **options, read_timeout=5.0, timeout=15.0)
        results = contend(opener, pts, min(processes, writers))
        store = opener()
        final = store.get(_plan(pts[0]).fingerprint)
        store.close()
        return summary(results, final, pts) | {"processes": min(processes, writers)}


def measure(
    suite: Mapping[str, Sequence[int]],
    workloads: Sequence[str] = WORKLOADS,
    processes: int = 2,
    latency: float = 0.005,
) -> dict[str, Any]:
    """``{backend: {workload: {writers: summary}}}`` for each backend and writer count of
    ``suite`` and each workload."""
    out: dict[str, Any] = {}
    for backend, counts in suite.items():
        for workload in workloads:
            for n in counts:
                print(f"  {backend} {workload} {n} writers ...", flush=True)
                result = measure_backend(backend, n, workload, processes, latency)
                out.setdefault(backend, {}).setdefault(workload, {})[str(n)] = result
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.contention", description=__doc__)
    parser.add_argument("--backends", nargs="+", default=["local", "s3", "gcs", "sim"])
    parser.add_argument("--writers", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--processes", type=int, default=2, help="writer processes (not sim)")
    parser.add_argument("--latency", type=float, default=0.005, help="sim: seconds per call")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    suite = {backend: args.writers for backend in args.backends}
    results = measure(suite, args.workloads, args.processes, args.latency)
    print(json.dumps(results, indent=2) if args.json else contention_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
