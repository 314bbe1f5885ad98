"""A rollout: N nodes boot one new model version within a window, against S3 under load.

Each node is a thread running plancache's real code on its own local directory: a
``PlanCache`` (the plan: lookup started when the boot starts, joined after the weights load;
on a miss it profiles and records) and an ``ArtifactStore`` on the same store stack (the
compile artifact: fetched while the weights load, within the fetch bound and the producer's
pace; on a miss it compiles and uploads under the upload claim). The store is moto behind
``S3UnderLoad``: per-request latency, 503 SlowDown above a request rate per prefix, and one
bandwidth cap that all nodes share. Nodes are spread over a few worker processes (a process
exits as a node's would, waiting for records past their budget); the nodes of one process
share its botocore session (each has its own clients, verdict, tiers and stores).

SIMULATED, and said so in the figures: loading the weights, profiling and compiling are
sleeps (``Timing``); the artifact is ``artifact_bytes`` of incompressible bytes; free memory
and the profiled KV cache vary per node as in the fleet simulation (``Fleet``). A node's
cold time is what it would spend without plancache: weights + profile + compile.

Figures per run: nodes that profiled or compiled and why; requests (and 503s) and bytes
uploaded per key; each node's time to first forward against its cold time; observations
lost (a profiled node's observation that the store's final record neither holds nor covers).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import random
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.console import log_to_stderr
from benchmarks.fleet import Fleet, config_factors
from plancache import PlanCache, open_store
from plancache import _background as background
from plancache._artifacts.manifest import object_name
from plancache._artifacts.share import ArtifactStore, CompileSettings, Fetched, join_fetch
from plancache._config import Settings
from plancache._merge import covers
from plancache._observation import Observation
from plancache._signing import Keyring
from plancache.testing import servers

KiB = 1 << 10
KEY = "a1" * 32
RANK = "rank_0_0"
SIGNING_KEY = "rollout-signing-key-0123456789abcdef"  # the fleet's key: artifacts are code
PROCESSES = 4
SLOWER = 1.01
"""A first forward later than this times the node's cold time counts as slower than cold
(a boot that misses everything is cold plus a few milliseconds of threads and sleeps)."""


@dataclass(frozen=True)
class Timing:
    """SIMULATED seconds of a node's boot (scaled down from minutes)."""

    weights_s: float = 3.0
    profile_s: float = 0.5
    compile_s: float = 4.0

    @property
    def cold_s(self) -> float:
        return self.weights_s + self.profile_s + self.compile_s


@dataclass(frozen=True)
class Load:
    """How the store behaves (``S3UnderLoad``), scaled with the fleet."""

    delay_s: float = 0.02
    reads_per_s: int = 300
    writes_per_s: int = 150
    link_bytes_per_s: float = 40e6


@dataclass(frozen=True)
class Node:
    index: int
    arrival: float
    free_memory: int
    measured_kv: int
    directory: str


@dataclass(frozen=True)
class Spec:
    url: str
    options: dict[str, Any]
    timing: Timing
    artifact_bytes: int
    start_at: float
    """Wall-clock time (``time.time``) of the window's start, the same in every process."""


def _tree(root: Path, size: int) -> None:
    """What compiling leaves in vLLM's ``<key>`` directory: the same incompressible bytes
    on every node."""
    model = root / RANK / "model"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(random.Random(KEY).randbytes(size))


@functools.cache
def _session() -> Any:
    """The botocore session of this worker process's nodes (creating one costs 23 ms of CPU
    that a real node spends on its own cores, not on the two this simulation shares)."""
    from aiobotocore.session import AioSession

    return AioSession()


def boot(spec: Spec, node: Node) -> dict[str, Any]:
    """One node's boot, from its arrival to its first forward (then its exit's waits)."""
    time.sleep(max(0.0, spec.start_at + node.arrival - time.time()))
    t = spec.timing
    start = time.monotonic()
    factors = config_factors(0)
    settings = Settings(
        spec.url,
        local_tier=str(Path(node.directory) / "local"),
        storage_options={**spec.options, "session": _session()},
        keyring=Keyring(SIGNING_KEY),
    )
    cache = PlanCache.from_settings(settings)
    cache.warm()  # the store opens, and the probe (or the shared verdict) runs, off this path
    root = Path(node.directory) / "vllm" / KEY
    cancelled, streaming = threading.Event(), threading.Event()
    deadline = start + CompileSettings().fetch_timeout
    opened: list[ArtifactStore] = []

    def prefetch() -> Fetched:  # as the plugin's prefetch: when the model is built
        opened.append(ArtifactStore(settings, CompileSettings(), store=cache.store))
        return opened[0].fetch(
            root, KEY, RANK, deadline=deadline, cancelled=cancelled.is_set, streaming=streaming
        )

    fetching = background.start(prefetch, "rollout-prefetch")
    pending = cache.start_lookup(factors, node.free_memory)
    time.sleep(t.weights_s)
    decision = pending.result(cache.timeout)
    recorded: list[Any] = []
    save = threading.Thread(  # as the plugin saves: in the background, after the warm-up
        target=lambda: recorded.append(
            cache.record(
                factors,
                kv_cache_memory_bytes=node.measured_kv,
                free_memory_baseline=node.free_memory,
            )
        ),
        daemon=True,
    )
    if not decision.hit:
        time.sleep(t.profile_s)
    ended = join_fetch(fetching, deadline, streaming, cancelled, start)
    artifact = fetching.wait(0).reason if ended else "not-waited-for"
    compiled = artifact != "hit"
    upload: dict[str, bool] | str | None = None
    if compiled:  # what the compile writes, within its time
        began = time.monotonic()
        _tree(root, spec.artifact_bytes)
        time.sleep(max(0.0, t.compile_s - (time.monotonic() - began)))
    first_forward = time.monotonic() - start
    if not decision.hit:
        save.start()
    if compiled:
        producer: dict[str, object] = {"compile_s": t.compile_s}
        try:
            artifacts = opened[0] if opened else ArtifactStore(settings, CompileSettings())
            upload = artifacts.upload(root, KEY, RANK, producer=producer)
        except Exception as exc:  # reported, as the plugin logs it
            upload = f"{type(exc).__name__}: {exc}"
    if not decision.hit:
        save.join(cache.timeout + 1.0)  # a record past its budget goes on; the exit waits
    return {
        "node": node.index,
        "arrival": node.arrival,
        "first_forward_s": first_forward,
        "cold_s": t.cold_s,
        "plan": decision.reason,
        "profiled": not decision.hit,
        "record": str(recorded[0].reason) if recorded else None,
        "observation": None if decision.hit else [node.measured_kv, node.free_memory],
        "artifact": artifact,
        "compiled": compiled,
        "upload": upload,
    }


def _worker(spec: Spec, nodes: list[Node], out: str) -> None:
    """One process's nodes, each in a thread; their reports to ``out`` (JSON). The process
    then exits normally, so that records past their budget get their exit wait."""
    log_to_stderr()
    from plancache._backends import s3  # noqa: F401  (the client library, as warm does)

    reports: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda n=n: reports.append(boot(spec, n))) for n in nodes]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    Path(out).write_text(json.dumps(reports))


def run(
    work: Path,
    moto: servers.MotoS3,
    nodes: int,
    window: float,
    *,
    timing: Timing = Timing(),
    load: Load = Load(),
    artifact_bytes: int = 512 * KiB,
    seed: int = 0,
) -> dict[str, Any]:
    """One rollout of ``nodes`` nodes arriving within ``window`` seconds on a fresh bucket."""
    bucket = f"rollout-{nodes}-{os.getpid()}-{int(time.time() * 1e3)}"
    moto.create_bucket(bucket)
    fleet = Fleet.draw(seed, nodes=nodes, configs=1, rounds=1, window=window, stragglers=0.0)
    population = [
        Node(n, fleet.arrival[0][n], fleet.free[n], fleet.measured_kv(0, n), str(work / f"n{n}"))
        for n in range(nodes)
    ]
    ctx = multiprocessing.get_context("spawn")
    proxy = servers.S3UnderLoad(moto.endpoint, **asdict(load))
    with servers.fake_aws_env(), proxy:
        options = {"endpoint_url": proxy.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
        spec = Spec(f"s3://{bucket}/models", options, timing, artifact_bytes, time.time() + 5.0)
        workers = []
        for i in range(PROCESSES):
            out = str(work / f"reports-{i}.json")
            mine = population[i::PROCESSES]
            workers.append((ctx.Process(target=_worker, args=(spec, mine, out)), out))
        for w, _ in workers:
            w.start()
        for w, _ in workers:
            w.join(900)
        reports = [r for _, out in workers for r in json.loads(Path(out).read_text())]
        requests = proxy.requests
        name = object_name(KEY, RANK)
        uploaded = sum(n for obj, n in proxy.received_by_name.items() if obj.startswith(name))
        figures = _summary(reports, requests, uploaded, proxy.throttled, timing)
        figures["observations_lost"] = _lost(reports, moto, bucket)
    artifact = _artifact_size(moto, bucket)
    figures.update(
        nodes=nodes,
        window_s=window,
        load=asdict(load),
        artifact_bytes=artifact,
        upload_bytes_per_key=figures["artifact_uploaded_bytes"] / artifact if artifact else None,
        timing=asdict(timing),
        simulated="loading weights, profiling and compiling (sleeps); the artifact's bytes",
    )
    return figures


def _artifact_size(moto: servers.MotoS3, bucket: str) -> int:
    """The stored artifact's size (0 if none was stored)."""
    store = open_store(f"s3://{bucket}/models", endpoint_url=moto.endpoint)
    found = store.open_object(object_name(KEY, RANK))
    if found is None:
        return 0
    size = 0
    try:
        while chunk := found.read(1 << 20):
            size += len(chunk)
    finally:
        found.close()
    return size


def _lost(reports: list[dict[str, Any]], moto: servers.MotoS3, bucket: str) -> int:
    """Profiled observations that the store's final record neither holds nor covers."""
    store = open_store(f"s3://{bucket}/models", endpoint_url=moto.endpoint)
    from plancache._plan import Plan

    fp = Plan.new(config_factors(0), kv_cache_memory_bytes=1, free_memory_baseline=1).fingerprint
    plan = store.get(fp)
    stored = plan.observations if plan is not None else ()
    lost = 0
    for r in reports:
        if r["observation"] is not None:
            kv, free = r["observation"]
            lost += not covers(stored, Observation(kv, free, 0.0))
    return lost


def _summary(
    reports: list[dict[str, Any]],
    requests: list[tuple[str, str]],
    uploaded: int,
    throttled: int,
    timing: Timing,
) -> dict[str, Any]:
    ratios = [r["first_forward_s"] / r["cold_s"] for r in reports]
    late = [r for r in reports if r["first_forward_s"] > r["cold_s"] * 1.05 + 1.0]
    probe = [p for _, p in requests if ".plancache-probe" in p]
    return {
        "boots": len(reports),
        "profiled": sum(r["profiled"] for r in reports),
        "plan_reasons": dict(Counter(r["plan"] for r in reports)),
        "record_reasons": dict(Counter(r["record"] for r in reports if r["record"])),
        "compiled": sum(r["compiled"] for r in reports),
        "artifact_reasons": dict(Counter(r["artifact"] for r in reports)),
        "uploads_created": sum(
            isinstance(r["upload"], dict) and bool(r["upload"].get("store")) for r in reports
        ),
        "upload_errors": [r["upload"] for r in reports if isinstance(r["upload"], str)][:5],
        "first_forward_vs_cold": _quantiles(ratios),
        "slower_than_cold": sum(ratio > SLOWER for ratio in ratios),
        "beyond_5pct_plus_1s": len(late),
        "requests": len(requests),
        "requests_by_method": dict(Counter(m for m, _ in requests)),
        "probe_requests": len(probe),
        "shared_verdict_reads": sum("verdict.json" in p for p in probe),
        "throttled_503": throttled,
        "artifact_uploaded_bytes": uploaded,
    }


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    at = {q: ordered[min(len(ordered) - 1, round(q * len(ordered)))] for q in (0.1, 0.5, 0.9)}
    return {
        "min": ordered[0],
        **{f"p{round(q * 100)}": v for q, v in at.items()},
        "max": ordered[-1],
    }


def measure(work: Path, sizes: tuple[tuple[int, float], ...] = ((100, 10.0),)) -> dict[str, Any]:
    """A rollout per (nodes, window) on one moto server."""
    out: dict[str, Any] = {
        "simulated": True,
        "processes": PROCESSES,
        "load": asdict(Load()),
        "runs": {},
    }
    with servers.fake_aws_env(), servers.MotoS3Process() as moto:
        for nodes, window in sizes:
            t0 = time.monotonic()
            run_dir = work / f"rollout-{nodes}"
            out["runs"][str(nodes)] = run(run_dir, moto, nodes, window)
            out["runs"][str(nodes)]["wall_s"] = time.monotonic() - t0
    return out


if __name__ == "__main__":
    import sys
    import tempfile

    sizes = tuple((int(a), float(b)) for a, b in (x.split(":") for x in sys.argv[1:])) or (
        (100, 10.0),
    )
    with tempfile.TemporaryDirectory(prefix="plancache-rollout-") as tmp:
        print(json.dumps(measure(Path(tmp), sizes), indent=1))


def table(results: dict[str, Any]) -> str:
    """One line per rollout."""
    lines = [
        "rollout: one new key, nodes arriving within the window, S3 (moto) under load "
        f"(SIMULATED boot phases; {results['processes']} processes of node threads)",
        f"  {'nodes':>5s} {'window':>6s} {'profiled':>8s} {'compiled':>8s} {'why (artifact)':28s} "
        f"{'first forward / cold: p50 p90 max':>34s} {'>cold':>5s} {'>5%+1s':>6s} "
        f"{'upload/key':>10s} {'requests':>8s} {'503':>4s} {'lost':>4s}",
    ]
    for nodes, r in results["runs"].items():
        why = ", ".join(f"{k} {v}" for k, v in sorted(r["artifact_reasons"].items()))
        q = r["first_forward_vs_cold"]
        per_key = r["upload_bytes_per_key"]
        lines.append(
            f"  {nodes:>5s} {r['window_s']:5.0f}s {r['profiled']:8d} {r['compiled']:8d} "
            f"{why:28s} {q['p50']:12.2f}x {q['p90']:.2f}x {q['max']:.2f}x "
            f"{r['slower_than_cold']:5d} {r['beyond_5pct_plus_1s']:6d} "
            f"{'-' if per_key is None else f'{per_key:.2f}x':>10s} {r['requests']:8d} "
            f"{r['throttled_503']:4d} {r['observations_lost']:4d}"
        )
    t, load = next(iter(results["runs"].values()))["timing"], results["load"]
    lines.append(
        f"  boot phases (SIMULATED): weights {t['weights_s']} s, profile {t['profile_s']} s, "
        f"compile {t['compile_s']} s; store: +{load['delay_s'] * 1e3:.0f} ms per request, "
        f"503 above {load['reads_per_s']} reads or {load['writes_per_s']} writes per s per "
        f"prefix, {load['link_bytes_per_s'] / 1e6:.0f} MB/s shared"
    )
    lines.append(
        "  >cold: first forward over 1.01x the node's cold time; lost: profiled observations "
        "the final record neither holds nor covers"
    )
    return "\n".join(lines)


def row(results: dict[str, Any]) -> tuple[str, str]:
    """The headline's line: the largest rollout."""
    nodes, r = max(results["runs"].items(), key=lambda kv: int(kv[0]))
    q = r["first_forward_vs_cold"]
    per_key = r["upload_bytes_per_key"]
    return (
        f"rollout: {nodes} nodes in {r['window_s']:.0f} s, one new key (simulated phases)",
        f"first forward p50 {q['p50']:.2f}x / max {q['max']:.2f}x cold; "
        f"{r['slower_than_cold']} slower than cold; {r['compiled']} compiled, "
        f"{r['profiled']} profiled; "
        + (f"{per_key:.2f}x the artifact uploaded; " if per_key is not None else "")
        + f"{r['observations_lost']} observations lost",
    )
