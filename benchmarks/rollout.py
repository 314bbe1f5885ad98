"""A rollout: N nodes boot one new model version within a window, against S3 under load,
beside the same rollout without plancache.

Each node boots twice, at the same moment, in the same process: its *on* twin with
plancache, its *off* twin without (weights, profile, compile: every node profiles and
compiles, as a fleet without plancache does). Both twins of every node share the machine's
load at every moment, so a node's first forward is compared with its own off twin's, not with
a nominal cold time: what CPU starvation of this 2-core machine costs falls on both, and
what remains is plancache's. The machine's load (CPU seconds per wall second, every process)
is reported beside each run.

Each on twin is a thread running plancache's real code on its own local directory: a
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
uploaded per key; each node's time to first forward against its off twin's; observations
lost (a profiled node's observation that the store's final record neither holds nor covers,
and that its node does not keep marked for its next boot) and those kept for the next boot;
the goals (``GOALS``) met or not. The final state is read from the emulator directly (not
through the load), with retries; where it still cannot be read, the run says so instead of
failing.
"""

from __future__ import annotations

import dataclasses
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

from benchmarks import front, machine
from benchmarks.console import log_to_stderr
from benchmarks.fleet import Fleet, config_factors
from plancache import ObjectLayer, PlanCache, PlanStoreError, open_store
from plancache import _background as background
from plancache._artifacts.engine import CompileSettings, Fetched
from plancache._artifacts.manifest import artifact_object_name
from plancache._artifacts.pacing import join_fetch
from plancache._artifacts.store import ArtifactStore
from plancache._backends.tiered import UNSHARED_PREFIX
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
"""A first forward later than this times its off twin's counts as slower than without
plancache (a boot that misses everything is its off twin plus a few milliseconds)."""
START_UP_S = 0.25
"""A thread's start-up, the allowance the docs give a wait for a plan beyond its budget
(``Thread.start``: 0.1 to 1 ms on a loaded machine, several ms at the tail), taken
generously: 500 node threads share each worker process's interpreter lock, and a waiting
thread wakes only once it gets it (up to 0.12 s late at a load of 20 on 2 cores)."""
GOALS = {
    "slower": "at most 1% of nodes slower than their off twin by more than 1.01x",
    "late": "no node beyond its off twin by 5% + 1 s",
    "uploads": "one upload per key, at most 1.2x the artifact's bytes",
    "lost": "no observation lost",
    "lookup": "no node waits for its plan past PLANCACHE_TIMEOUT from the lookup's start, "
    f"plus a thread's start-up ({START_UP_S} s): after weights that took longer, not at all",
}
ACCOUNTING_TRIES = 5
"""Reads of the final state (the emulator directly) before a run says it could not."""


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
    overload_s: float = 0.0
    """Seconds from the window's start in which every request answers ``overload_delay_s``
    later still: a store the herd's first seconds overload (beyond the client's bounds)."""
    overload_delay_s: float = 2.0


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
    start_at: float = 0.0
    """Wall-clock time (``time.time``) of the window's start, the same in every process (set
    once every worker process is ready: ``_worker``)."""


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
    joined = time.perf_counter()  # as the plugin joins: the budget runs from the lookup's start
    decision = pending.result(cache.timeout - (joined - pending.started))
    waited = time.perf_counter() - joined
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
        "lookup_s": decision.seconds,
        "waited_s": waited,
        "wait_budget_s": max(0.0, cache.timeout - (joined - pending.started)),
        "profiled": not decision.hit,
        "record": str(recorded[0].reason) if recorded else None,
        "observation": None if decision.hit else [node.measured_kv, node.free_memory],
        "artifact": artifact,
        "compiled": compiled,
        "upload": upload,
    }


def boot_off(spec: Spec, node: Node) -> dict[str, Any]:
    """The node's off twin: the same boot without plancache (it profiles and compiles)."""
    time.sleep(max(0.0, spec.start_at + node.arrival - time.time()))
    t = spec.timing
    start = time.monotonic()
    time.sleep(t.weights_s)
    time.sleep(t.profile_s)
    began = time.monotonic()
    _tree(Path(node.directory) / "off" / KEY, spec.artifact_bytes)
    time.sleep(max(0.0, t.compile_s - (time.monotonic() - began)))
    return {"node": node.index, "first_forward_s": time.monotonic() - start}


def _worker(spec: Spec, nodes: list[Node], out: str, ready: Any, start: Any, go: Any) -> None:
    """One process's nodes, each twin in a thread; their reports to ``out`` (JSON). The
    window opens only once every worker process has imported its libraries and made its
    session (``ready``, then ``go`` with the window's ``start``): a process still importing
    would hold its first nodes back and then start them all at once. The process then exits
    normally, so that records past their budget get their exit wait."""
    log_to_stderr()
    import fsspec.asyn

    from plancache._backends import s3  # noqa: F401  (the client library, as warm does)

    _session()
    ready.wait(300)
    go.wait(300)
    spec = dataclasses.replace(spec, start_at=start.value)
    stop = threading.Event()
    lags = front.loop_lags(fsspec.asyn.get_loop(), stop)  # the loop every node's requests use
    reports: dict[str, list[Any]] = {"on": [], "off": []}
    threads = [
        threading.Thread(target=lambda n=n, f=f, k=k: reports[k].append(f(spec, n)))
        for n in nodes
        for k, f in (("on", boot), ("off", boot_off))
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    stop.set()
    reports["lags"] = lags.result(60)
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
    """One rollout of ``nodes`` nodes arriving within ``window`` seconds on a fresh bucket,
    each node with its off twin (see the module). Raises only where a worker process failed
    (a defect); a store that cannot be read afterwards is said in the figures."""
    bucket = f"rollout-{nodes}-{os.getpid()}-{int(time.time() * 1e3)}"
    moto.create_bucket(bucket)
    fleet = Fleet.draw(seed, nodes=nodes, configs=1, rounds=1, window=window, stragglers=0.0)
    population = [
        Node(n, fleet.arrival[0][n], fleet.free[n], fleet.measured_kv(0, n), str(work / f"n{n}"))
        for n in range(nodes)
    ]
    ctx = multiprocessing.get_context("spawn")
    proxy = front.Front(
        moto.endpoint,
        delay_s=load.delay_s,
        reads_per_s=load.reads_per_s,
        writes_per_s=load.writes_per_s,
        link_bytes_per_s=load.link_bytes_per_s,
    )
    with servers.fake_aws_env(), proxy:
        options = {"endpoint_url": proxy.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
        spec = Spec(f"s3://{bucket}/models", options, timing, artifact_bytes)
        ready, start, go = ctx.Barrier(PROCESSES + 1), ctx.Value("d", 0.0), ctx.Event()
        workers = []
        for i in range(PROCESSES):
            out = str(work / f"reports-{i}.json")
            mine = population[i::PROCESSES]
            args = (spec, mine, out, ready, start, go)
            workers.append((ctx.Process(target=_worker, args=args), out))
        for w, _ in workers:
            w.start()
        try:
            ready.wait(300)  # every worker has imported and made its session
        except threading.BrokenBarrierError:
            for w, _ in workers:
                w.kill()
            raise RuntimeError("a rollout worker process did not start (see the log)") from None
        start.value, opened = time.time() + 1.0, time.monotonic() + 1.0
        proxy.overload(opened + load.overload_s, load.overload_delay_s)
        go.set()
        cpu, wall = machine.cpu_seconds(), time.monotonic()
        for w, _ in workers:
            w.join(900)
        cpu_after, wall = machine.cpu_seconds(), time.monotonic() - wall
        failed = [w.exitcode for w, _ in workers if w.exitcode != 0]
        if failed:
            raise RuntimeError(f"rollout worker processes failed: exit {failed} (see the log)")
        reports: dict[str, list[Any]] = {"on": [], "off": [], "lags": []}
        for _, out in workers:
            for twin, found in json.loads(Path(out).read_text()).items():
                reports[twin] += found
        seen = proxy.report()
        name = artifact_object_name(KEY, RANK)
        uploaded = sum(n for obj, n in seen["received_by_name"].items() if obj.startswith(name))
        figures = _summary(reports, seen["requests"], uploaded, seen["throttled"])
        figures.update(front.evidence(seen, reports["lags"], opened))
    figures.update(_final_state(reports["on"], population, moto, bucket))
    artifact = figures.get("artifact_bytes")
    figures.update(
        nodes=nodes,
        window_s=window,
        load=asdict(load),
        machine_load=None if cpu is None or cpu_after is None else (cpu_after - cpu) / wall,
        cores=os.cpu_count(),
        upload_bytes_per_key=figures["artifact_uploaded_bytes"] / artifact if artifact else None,
        timing=asdict(timing),
        simulated="loading weights, profiling and compiling (sleeps); the artifact's bytes",
    )
    figures["goals"] = _goals(figures)
    return figures


def _final_state(
    reports: list[dict[str, Any]], population: list[Node], moto: servers.MotoS3, bucket: str
) -> dict[str, Any]:
    """What the store holds at the end, read from the emulator directly (not through the
    load), ``ACCOUNTING_TRIES`` times at most: the artifact's size, and the observations
    lost and kept (see the module); ``{"accounting": why}`` where it could not be read."""
    why = ""
    for attempt in range(ACCOUNTING_TRIES):
        time.sleep(attempt * 2.0)
        store = open_store(
            f"s3://{bucket}/models", endpoint_url=moto.endpoint, read_timeout=20, timeout=60
        )
        try:
            size = _artifact_size(store.layer)
            return {"artifact_bytes": size, **_lost(reports, population, store)}
        except PlanStoreError as exc:
            why = f"{type(exc).__name__}: {exc}"
        finally:
            store.close()
    return {"accounting": f"the final state could not be read ({ACCOUNTING_TRIES} tries): {why}"}


def _artifact_size(store: ObjectLayer) -> int:
    """The stored artifact's size (0 if none was stored)."""
    found = store.open_object(artifact_object_name(KEY, RANK))
    if found is None:
        return 0
    size = 0
    try:
        while chunk := found.read(1 << 20):
            size += len(chunk)
    finally:
        found.close()
    return size


def _lost(reports: list[dict[str, Any]], population: list[Node], store: Any) -> dict[str, int]:
    """Profiled observations that the store's final record neither holds nor covers: those
    whose node keeps them marked for its next boot (``kept``), and the others (``lost``)."""
    from plancache._plan import Plan

    fp = Plan.new(config_factors(0), kv_cache_memory_bytes=1, free_memory_baseline=1).fingerprint
    plan = store.get(fp)
    stored = plan.observations if plan is not None else ()
    lost = kept = 0
    for r in reports:
        if r["observation"] is not None:
            kv, free = r["observation"]
            if not covers(stored, Observation(kv, free, 0.0)):
                local = open_store(str(Path(population[r["node"]].directory) / "local"))
                marked = UNSHARED_PREFIX + fp in set(local.layer.list_objects(UNSHARED_PREFIX))
                kept += marked
                lost += not marked
    return {"observations_lost": lost, "observations_kept_for_next_boot": kept}


def _goals(r: dict[str, Any]) -> dict[str, bool | None]:
    """Each of ``GOALS``: met, not met, or None where it could not be measured."""
    per_key = r["upload_bytes_per_key"]
    lost = r.get("observations_lost")
    return {
        "slower": r["slower_than_off"] <= 0.01 * r["boots"],
        "late": r["beyond_5pct_plus_1s"] == 0,
        "uploads": None
        if "accounting" in r
        else r["uploads_created"] == 1 and per_key is not None and per_key <= 1.2,
        "lost": None if lost is None else lost == 0,
        "lookup": r["lookups_past_bound"] == 0,
    }


def _summary(
    reports: dict[str, list[dict[str, Any]]],
    requests: list[tuple[str, str]],
    uploaded: int,
    throttled: int,
) -> dict[str, Any]:
    on = sorted(reports["on"], key=lambda r: r["node"])
    off = {r["node"]: r["first_forward_s"] for r in reports["off"]}
    ratios = [r["first_forward_s"] / off[r["node"]] for r in on]
    late = [r for r in on if r["first_forward_s"] > off[r["node"]] * 1.05 + 1.0]
    probe = [p for _, p in requests if ".plancache-probe" in p]
    return {
        "boots": len(on),
        "profiled": sum(r["profiled"] for r in on),
        "plan_reasons": dict(Counter(r["plan"] for r in on)),
        "record_reasons": dict(Counter(r["record"] for r in on if r["record"])),
        "compiled": sum(r["compiled"] for r in on),
        "artifact_reasons": dict(Counter(r["artifact"] for r in on)),
        "uploads_created": sum(
            isinstance(r["upload"], dict) and bool(r["upload"].get("store")) for r in on
        ),
        "upload_errors": [r["upload"] for r in on if isinstance(r["upload"], str)][:5],
        "first_forward_vs_off": _quantiles(ratios),
        "off_vs_cold": _quantiles([off[r["node"]] / r["cold_s"] for r in on]),
        "slower_than_off": sum(ratio > SLOWER for ratio in ratios),
        "slower_why": dict(
            Counter(
                f"plan {r['plan']}, artifact {r['artifact']}"
                for r, ratio in zip(on, ratios, strict=True)
                if ratio > SLOWER
            )
        ),
        "beyond_5pct_plus_1s": len(late),
        "lookup_max_s": max(r["lookup_s"] for r in on),
        "waited_after_weights_max_s": max(r["waited_s"] for r in on),
        "past_budget_max_s": max(r["waited_s"] - r["wait_budget_s"] for r in on),
        "lookups_past_bound": sum(r["waited_s"] > r["wait_budget_s"] + START_UP_S for r in on),
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


def measure(
    work: Path, sizes: tuple[tuple[int, float], ...] = ((100, 10.0),), repeat: int = 1
) -> dict[str, Any]:
    """A rollout per (nodes, window), ``repeat`` times each, on one moto server (in its own
    process); runs are keyed ``"<nodes>"``, then ``"<nodes> #2"``, ..."""
    out: dict[str, Any] = {
        "simulated": True,
        "processes": PROCESSES,
        "load": asdict(Load()),
        "runs": {},
    }
    with servers.fake_aws_env(), servers.MotoS3Process() as moto:
        for nodes, window in sizes:
            for i in range(repeat):
                t0 = time.monotonic()
                label = str(nodes) if i == 0 else f"{nodes} #{i + 1}"
                run_dir = work / f"rollout-{nodes}-{i}"
                out["runs"][label] = run(run_dir, moto, nodes, window)
                out["runs"][label]["wall_s"] = time.monotonic() - t0
    return out


def _goal_text(r: dict[str, Any]) -> str:
    """``met``, or the goals not met (``?``: not measured); a run whose harness failed says
    so first (its goals judge the machine, not plancache)."""
    goals = r["goals"]
    text = (
        "met"
        if all(goals.values())
        else "NOT MET: "
        + ", ".join(g if met is False else f"{g}?" for g, met in goals.items() if not met)
    )
    failed = r["harness"]["failed"]
    return f"HARNESS FAILED ({'; '.join(failed)}), goals {text}" if failed else text


def table(results: dict[str, Any]) -> str:
    """One line per rollout."""
    lines = [
        "rollout: one new key, nodes arriving within the window, S3 (moto) under load "
        f"(SIMULATED boot phases; {results['processes']} processes of node threads, each node "
        "beside its off twin: the same boot without plancache)",
        f"  {'nodes':>7s} {'window':>6s} {'load':>5s} {'profiled':>8s} {'compiled':>8s} "
        f"{'why (artifact)':28s} {'first forward / off: p50 p90 max':>33s} {'>off':>4s} "
        f"{'>5%+1s':>6s} {'upload/key':>10s} {'requests':>8s} {'503':>4s} {'lost':>4s} "
        f"{'kept':>4s}  goals",
    ]
    for label, r in results["runs"].items():
        why = ", ".join(f"{k} {v}" for k, v in sorted(r["artifact_reasons"].items()))
        q = r["first_forward_vs_off"]
        per_key = r["upload_bytes_per_key"]
        load = "-" if r["machine_load"] is None else f"{r['machine_load']:.2f}"
        lost, kept = (
            ("-", "-")
            if "accounting" in r
            else (r["observations_lost"], r["observations_kept_for_next_boot"])
        )
        lines.append(
            f"  {label:>7s} {r['window_s']:5.0f}s {load:>5s} {r['profiled']:8d} "
            f"{r['compiled']:8d} {why:28s} {q['p50']:11.2f}x {q['p90']:.2f}x {q['max']:.2f}x "
            f"{r['slower_than_off']:4d} {r['beyond_5pct_plus_1s']:6d} "
            f"{'-' if per_key is None else f'{per_key:.2f}x':>10s} {r['requests']:8d} "
            f"{r['throttled_503']:4d} {lost:>4} {kept:>4}  {_goal_text(r)}"
        )
        if "accounting" in r:
            lines.append(f"    {r['accounting']}")
        lines.append("    " + _lookups(r) + "; " + _harness(r))
    t, load = next(iter(results["runs"].values()))["timing"], results["load"]
    lines.append(
        f"  boot phases (SIMULATED): weights {t['weights_s']} s, profile {t['profile_s']} s, "
        f"compile {t['compile_s']} s; store: +{load['delay_s'] * 1e3:.0f} ms per request, "
        f"503 above {load['reads_per_s']} reads or {load['writes_per_s']} writes per s per "
        f"prefix, {load['link_bytes_per_s'] / 1e6:.0f} MB/s shared"
    )
    lines.append(
        "  load: the machine's CPU seconds per wall second during the run (all processes; "
        f"{next(iter(results['runs'].values()))['cores']} cores); >off: first forward over "
        f"{SLOWER}x the node's off twin's; lost: profiled observations the final record "
        "neither holds nor covers, not kept either; kept: marked for the node's next boot"
    )
    lines.append(
        "  harness: what the simulation's own parts did (the proxy in its own process, moto, "
        f"the node processes' event loops); it failed where it held anything past "
        f"{front.HARNESS_BOUND_S} s, refused a connection or lost an answer (per second: "
        'results.json, the run\'s "seconds")'
    )
    lines.append("  goals: " + "; ".join(f"{g}: {text}" for g, text in GOALS.items()))
    return "\n".join(lines)


def _lookups(r: dict[str, Any]) -> str:
    """The run's longest lookup and longest wait for a plan after the weights."""
    return (
        f"lookups: longest {r['lookup_max_s']:.2f} s (from the boot's start, the weights' "
        f"load included), longest wait after the weights {r['waited_after_weights_max_s']:.3f}"
        f" s (at most {r['past_budget_max_s']:.3f} s past what was left of the budget), "
        f"{r['lookups_past_bound']} past the bound"
    )


def _harness(r: dict[str, Any]) -> str:
    """The harness's failures and its worst seconds, apart from the store's answers."""
    h = r["harness"]
    overflows = "?" if h["listen_overflows"] is None else h["listen_overflows"]
    return (
        f"harness: the store answered {h['answered']}; {h['client_gone']} clients gone before "
        "their answer, "
        f"{h['upstream_failed']} answers lost by moto, {overflows} listen overflows on the "
        f"machine (the proxy's queue peaked at {h['listen_queue_peak']} of "
        f"{h['listen_queue_size']}); worst: accept {h['accept_max_s'] * 1e3:.0f} ms, proxy "
        f"{h['proxy_max_s'] * 1e3:.0f} ms, moto {h['moto_max_s'] * 1e3:.0f} ms, a node "
        "process's event loop "
        f"{h['loop_lag_max_s'] * 1e3:.0f} ms late"
    )


def row(results: dict[str, Any]) -> tuple[str, str]:
    """The headline's line: the largest rollout (its first run)."""
    label, r = max(results["runs"].items(), key=lambda kv: int(kv[1]["nodes"]))
    q = r["first_forward_vs_off"]
    per_key = r["upload_bytes_per_key"]
    lost = "-" if "accounting" in r else r["observations_lost"]
    return (
        f"rollout: {label} nodes in {r['window_s']:.0f} s, one new key (simulated phases)",
        f"first forward p50 {q['p50']:.2f}x / max {q['max']:.2f}x its off twin's; "
        f"{r['slower_than_off']} slower than off; {r['compiled']} compiled, "
        f"{r['profiled']} profiled; "
        + (f"{per_key:.2f}x the artifact uploaded; " if per_key is not None else "")
        + f"{lost} observations lost; longest lookup {r['lookup_max_s']:.2f} s, wait after "
        f"the weights {r['waited_after_weights_max_s']:.3f} s; goals {_goal_text(r)}",
    )


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout")
    parser.add_argument("sizes", nargs="*", default=["100:10"], help="NODES:WINDOW_SECONDS")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each size")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    sizes = tuple((int(a), float(b)) for a, b in (x.split(":") for x in args.sizes))
    with tempfile.TemporaryDirectory(prefix="plancache-rollout-") as tmp:
        found = measure(Path(tmp), sizes, args.repeat)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    print(table(found))
