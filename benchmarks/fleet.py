"""Fleet simulation: N nodes boot against one store, round after round, as a real fleet does.

The fleet is heterogeneous (``Fleet``): each node's free memory at boot differs by up to
±2 GiB from the others', each profiled boot's KV cache jitters by up to ±64 MiB, and some
nodes straggle (arrive late in a round). A boot looks up its plan; on a miss it "profiles"
(SIMULATED: a sleep of ``profile_seconds``, or simulated time in ``sweep``) and records what
it measured. Two runs:

- ``simulate``: worker processes, in real time, to time lookups under contention.
- ``sweep``: many seeds in simulated time (events in arrival order, through the real
  ``PlanCache.lookup``/``record`` on real local stores), to count who still profiles and how
  much KV cache each node gives up, before (one point per key) and after (the frontier).

Set-ups of ``simulate``:

- ``none``: no plans; every boot profiles.
- ``per-node``: each node keeps plans on its own disk (what vLLM's built-in startup plan does).
- ``shared``: plancache with a shared store (S3 on a loopback server) and a local tier per node.

Each node process imports the S3 client library before its first boot, as the vLLM plugin does
while the model loads (``PlanCache.warm``); 32 such imports at once would not fit a 2 s
lookup budget on a 2-core machine, and that contention is not what a real node sees.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.console import log_to_stderr
from benchmarks.factors import worker_factors
from benchmarks.stats import percentiles
from plancache import Plan, PlanCache
from plancache._backends.local import LocalStore
from plancache._config import Settings
from plancache._keys import Scalar
from plancache._merge import dominates
from plancache._store import PlanStore
from plancache.testing import GiB

MiB = 1 << 20
SETUPS = ("none", "per-node", "shared")
POLICIES = ("per-node", "single-point", "frontier")
"""Set-ups of ``sweep``: each node its own local store (vLLM's built-in); one shared store
under the schema-1 rule (before); one shared store with plancache's frontier (after)."""
FREE_SPREAD = 2 * GiB
KV_JITTER = 64 * MiB


@dataclass(frozen=True)
class Fleet:
    """One seed's heterogeneous fleet: per-node free memory (fixed for the node), per-boot
    KV jitter and arrival times (stragglers arrive late), drawn from ``seed``."""

    nodes: int
    configs: int
    rounds: int
    free: list[int]
    arrival: list[list[float]]
    """``arrival[round][node]``, seconds into the round."""
    jitter: list[list[int]]
    """``jitter[round][node]``: what that boot's profiling would add to the config's KV."""

    @classmethod
    def draw(
        cls,
        seed: int,
        *,
        nodes: int,
        configs: int,
        rounds: int,
        window: float,
        stragglers: float = 0.15,
    ) -> Fleet:
        """Free memory 130 GiB ±2 GiB; arrivals uniform in ``window``, except a fraction
        ``stragglers`` that arrive up to two windows after it; KV jitter ±64 MiB."""
        rng = random.Random(seed)
        free = [130 * GiB + rng.randint(-FREE_SPREAD, FREE_SPREAD) for _ in range(nodes)]

        def arrive() -> float:
            late = rng.random() < stragglers
            return window + rng.uniform(0, 2 * window) if late else rng.uniform(0, window)

        arrival = [[arrive() for _ in range(nodes)] for _ in range(rounds)]
        jitter = [[rng.randint(-KV_JITTER, KV_JITTER) for _ in range(nodes)] for _ in range(rounds)]
        return cls(nodes, configs, rounds, free, arrival, jitter)

    def config(self, node: int) -> int:
        return node % self.configs

    def measured_kv(self, rnd: int, node: int) -> int:
        """What profiling node ``node`` in round ``rnd`` would find."""
        return profiled_kv(self.config(node)) + self.jitter[rnd][node]


@dataclass(frozen=True)
class Boot:
    """One node's boot in one round."""

    setup: str
    round: int
    node: int
    config: int
    delay: float
    free_memory: int
    measured_kv: int
    profile_seconds: float
    node_dir: str
    shared_url: str
    shared_options: dict[str, Any]
    timeout: float


def config_factors(config: int) -> dict[str, Scalar]:
    """The factors of one of the fleet's distinct engine configurations, as the vLLM plugin
    records them."""
    return worker_factors(f"fleet-config-{config}")


def profiled_kv(config: int) -> int:
    """What the (simulated) profiling finds before jitter: fixed per config."""
    return (60 + 5 * config) * GiB


def _open(boot: Boot) -> Any:
    if boot.setup == "per-node":
        return PlanStore(LocalStore(boot.node_dir))
    settings = Settings(
        url=boot.shared_url,
        timeout=boot.timeout,
        local_tier=boot.node_dir,
        storage_options=boot.shared_options,
    )
    return settings.open_store()


def _node_start(shared_url: str) -> None:
    """Pool initializer: log as the main job does (``console.log_to_stderr``); load the
    shared store's client library (see the module doc)."""
    log_to_stderr()
    if "://" in shared_url and not shared_url.startswith("file://"):
        from plancache._backends import s3  # noqa: F401


def boot_node(boot: Boot) -> dict[str, Any]:
    """Run one simulated boot; returns what happened and how long each part took."""
    time.sleep(boot.delay)
    start = time.perf_counter()
    factors = config_factors(boot.config)
    lookup_seconds = None
    reason = "no-plans"
    applied = None
    kv: int | None = None
    if boot.setup != "none":
        cache = PlanCache(lambda: _open(boot), timeout=boot.timeout)
        decision = cache.lookup(factors, boot.free_memory)
        lookup_seconds, reason, applied = decision.seconds, decision.reason, decision.hit
        kv = decision.kv_cache_memory_bytes
    profiled = not applied
    if profiled:
        time.sleep(boot.profile_seconds)
        kv = boot.measured_kv
        if boot.setup != "none":
            cache.record(
                factors,
                kv_cache_memory_bytes=boot.measured_kv,
                free_memory_baseline=boot.free_memory,
            )
    return {
        "setup": boot.setup,
        "round": boot.round,
        "node": boot.node,
        "config": boot.config,
        "reason": reason,
        "profiled": profiled,
        "given_up": boot.measured_kv - (kv or boot.measured_kv),
        "lookup_seconds": lookup_seconds,
        "boot_seconds": time.perf_counter() - start,
    }


def _final_check(boots: list[Boot]) -> dict[str, Any]:
    """After the last round: every node's view of its plan is valid and would apply."""
    valid = applicable = 0
    for boot in boots:
        if boot.setup == "none":
            continue
        store = _open(boot)
        fp = Plan.new(
            config_factors(boot.config), kv_cache_memory_bytes=1, free_memory_baseline=1
        ).fingerprint
        plan = store.get(fp)
        store.close()
        if plan is not None:
            valid += 1
            applicable += plan.min_free_memory_baseline <= boot.free_memory  # lowest baseline
    return {"nodes_with_valid_plan": valid, "nodes_whose_plan_applies": applicable}


def simulate(
    work_dir: Path,
    shared_url: str,
    shared_options: dict[str, Any],
    *,
    nodes: int = 32,
    configs: int = 4,
    profile_seconds: float = 0.2,
    arrival_window: float = 1.0,
    rounds: int = 4,
    timeout: float = 2.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Run every set-up for ``rounds`` rounds on ``nodes`` processes; returns the figures."""
    fleet = Fleet.draw(seed, nodes=nodes, configs=configs, rounds=rounds, window=arrival_window)
    ctx = multiprocessing.get_context("spawn")
    results: dict[str, Any] = {
        "simulated": True,
        "nodes": nodes,
        "configs": configs,
        "rounds": rounds,
        "seed": seed,
        "profile_seconds_simulated": profile_seconds,
        "arrival_window_seconds": arrival_window,
        "setups": {},
    }
    with ctx.Pool(nodes, initializer=_node_start, initargs=(shared_url,)) as pool:
        for setup in SETUPS:
            records: list[dict[str, Any]] = []
            boots: list[Boot] = []
            for rnd in range(rounds):
                boots = [
                    Boot(
                        setup,
                        rnd,
                        n,
                        fleet.config(n),
                        fleet.arrival[rnd][n],
                        fleet.free[n],
                        fleet.measured_kv(rnd, n),
                        profile_seconds,
                        str(work_dir / setup / f"node{n}"),
                        f"{shared_url.rstrip('/')}/{setup}",
                        shared_options,
                        timeout,
                    )
                    for n in range(nodes)
                ]
                records += pool.map_async(boot_node, boots).get(timeout=600)
            results["setups"][setup] = _summarise(records, profile_seconds, nodes, rounds)
            results["setups"][setup].update(_final_check(boots))
    base = results["setups"]["none"]["profiles_paid"]
    for figures in results["setups"].values():
        figures["simulated_seconds_saved"] = (base - figures["profiles_paid"]) * profile_seconds
    return results


def _summarise(
    records: list[dict[str, Any]], profile_seconds: float, nodes: int, rounds: int
) -> dict[str, Any]:
    lookups = [r["lookup_seconds"] for r in records if r["lookup_seconds"] is not None]
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    return {
        "boots": len(records),
        "profiles_paid": sum(r["profiled"] for r in records),
        "profiles_paid_per_round": [
            sum(r["profiled"] for r in records if r["round"] == k) for k in range(rounds)
        ],
        "reasons": reasons,
        "lookup": percentiles(lookups),
        "lookup_per_round": [
            percentiles(
                [
                    r["lookup_seconds"]
                    for r in records
                    if r["round"] == k and r["lookup_seconds"] is not None
                ]
            )
            for k in range(rounds)
        ],
        "mean_boot_seconds": sum(r["boot_seconds"] for r in records) / len(records),
        "capacity_given_up": _given_up([r["given_up"] for r in records if not r["profiled"]]),
    }


def _given_up(samples: list[int]) -> dict[str, float]:
    """KV cache given up by boots that applied a plan: what the boot would have measured
    minus what it applied, mean and max in MiB and as % of the config's KV cache
    (negative: it applied more than it would have measured, within the jitter)."""
    if not samples:
        return {"boots": 0, "mean_mib": 0.0, "max_mib": 0.0, "mean_pct": 0.0, "max_pct": 0.0}
    kv = profiled_kv(0)
    mean, top = sum(samples) / len(samples), max(samples)
    return {
        "boots": len(samples),
        "mean_mib": mean / MiB,
        "max_mib": top / MiB,
        "mean_pct": 100 * mean / kv,
        "max_pct": 100 * top / kv,
    }


# -- the sweep: many seeds in simulated time, before (one point) vs after (frontier) -------------
def single_point_record(store: PlanStore, plan: Plan) -> None:
    """BEFORE, for comparison only: the schema-1 rule of plancache 0.1.0, where a record holds
    one point and a new point replaces it only if it dominates the stored one."""
    new = plan.observations[0]
    stored = store.rewrite(
        plan.fingerprint, lambda old: plan if dominates(new, old.observations[0]) else old
    )
    if stored is None:
        store.put(plan)


def _sweep_policy(fleet: Fleet, policy: str, root: Path, profile_seconds: float) -> dict[str, Any]:
    """One fleet under one policy, in simulated time: each round, boots in arrival order;
    a profiling boot's record lands ``profile_seconds`` after it arrived."""
    stores: dict[str, PlanStore] = {}

    def store_of(node: int) -> PlanStore:
        name = f"node{node}" if policy == "per-node" else "shared"
        if name not in stores:
            stores[name] = PlanStore(LocalStore(root / name))
        return stores[name]

    def record(node: int, rnd: int) -> None:
        factors, kv, free = (
            config_factors(fleet.config(node)),
            fleet.measured_kv(rnd, node),
            fleet.free[node],
        )
        if policy == "single-point":
            plan = Plan.new(factors, kv_cache_memory_bytes=kv, free_memory_baseline=free)
            single_point_record(store_of(node), plan)
        else:
            PlanCache(store_of(node), timeout=10).record(
                factors, kv_cache_memory_bytes=kv, free_memory_baseline=free
            )

    profiled: list[list[int]] = []
    given_up: list[int] = []
    for rnd in range(fleet.rounds):
        pending: list[tuple[float, int]] = []
        profiled.append([])
        for t, node in sorted((t, n) for n, t in enumerate(fleet.arrival[rnd])):
            for done in sorted(p for p in pending if p[0] <= t):
                record(done[1], rnd)
                pending.remove(done)
            d = PlanCache(store_of(node), timeout=10).lookup(
                config_factors(fleet.config(node)), fleet.free[node]
            )
            if d.kv_cache_memory_bytes is None:
                profiled[rnd].append(node)
                pending.append((t + profile_seconds, node))
            else:
                given_up.append(fleet.measured_kv(rnd, node) - d.kv_cache_memory_bytes)
        for _, node in sorted(pending):
            record(node, rnd)
    for store in stores.values():
        store.close()
    first = {
        n: min((r for r in range(fleet.rounds) if n in profiled[r]), default=fleet.rounds)
        for n in range(fleet.nodes)
    }
    again = {n for r in range(fleet.rounds) for n in profiled[r] if r > first[n]}
    return {
        "profiles_per_round": [len(p) for p in profiled],
        "profiling_in_last_round": len(profiled[-1]),
        "nodes_profiling_again": len(again),
        "capacity_given_up": _given_up(given_up),
    }


def sweep(
    work_dir: Path,
    seeds: int = 10,
    *,
    nodes: int = 32,
    configs: int = 4,
    rounds: int = 4,
    profile_seconds: float = 0.2,
    arrival_window: float = 1.0,
) -> dict[str, Any]:
    """Every policy on the fleets of seeds ``0..seeds-1`` (simulated time; real stores)."""
    per_seed: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    for seed in range(seeds):
        fleet = Fleet.draw(seed, nodes=nodes, configs=configs, rounds=rounds, window=arrival_window)
        for policy in POLICIES:
            root = work_dir / "sweep" / f"seed{seed}" / policy
            per_seed[policy].append(_sweep_policy(fleet, policy, root, profile_seconds))
    summary: dict[str, Any] = {}
    for policy, runs in per_seed.items():
        gave = [r["capacity_given_up"] for r in runs if r["capacity_given_up"]["boots"]]
        boots = max(1, sum(g["boots"] for g in gave))
        summary[policy] = {
            "seeds": runs,
            "mean_profiles_per_round": [
                sum(r["profiles_per_round"][k] for r in runs) / len(runs) for k in range(rounds)
            ],
            "profiling_in_last_round": [r["profiling_in_last_round"] for r in runs],
            "seeds_with_no_node_profiling_again": sum(
                r["nodes_profiling_again"] == 0 for r in runs
            ),
            "max_nodes_profiling_again": max(r["nodes_profiling_again"] for r in runs),
            "capacity_given_up": {
                "mean_mib": sum(g["mean_mib"] * g["boots"] for g in gave) / boots,
                "max_mib": max((g["max_mib"] for g in gave), default=0.0),
                "mean_pct": sum(g["mean_pct"] * g["boots"] for g in gave) / boots,
                "max_pct": max((g["max_pct"] for g in gave), default=0.0),
            },
        }
    return {
        "simulated": True,
        "store": "local directory",
        "seeds": seeds,
        "nodes": nodes,
        "configs": configs,
        "rounds": rounds,
        "profile_seconds_simulated": profile_seconds,
        "arrival_window_seconds": arrival_window,
        "free_memory_spread_gib": FREE_SPREAD / GiB,
        "kv_jitter_mib": KV_JITTER / MiB,
        "policies": summary,
    }
