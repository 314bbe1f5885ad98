"""Fleet simulation: N worker processes boot against one store, in three set-ups.

Each worker is a node with its own free memory. A boot looks up its plan; on a miss it
"profiles" (a sleep of ``profile_seconds``: SIMULATED, the figure vLLM's maintainers measured
for Qwen3-8B on an H100) and records the plan. Nodes arrive spread over a window (a rollout),
then all restart once. Set-ups:

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

from benchmarks.factors import worker_factors
from benchmarks.stats import percentiles
from plancache import Plan, PlanCache
from plancache.backends.local import LocalStore
from plancache.config import Settings
from plancache.plan import Scalar
from plancache.testing import GiB

SETUPS = ("none", "per-node", "shared")


@dataclass(frozen=True)
class Boot:
    """One node's boot in one round."""

    setup: str
    round: int
    node: int
    config: int
    delay: float
    free_memory: int
    profile_seconds: float
    node_dir: str
    shared_url: str
    shared_options: dict[str, Any]
    timeout: float


def config_factors(config: int) -> dict[str, Scalar]:
    """The factors of one of the fleet's distinct engine configurations."""
    return worker_factors(f"fleet-config-{config}")


def profiled_kv(config: int) -> int:
    """What the (simulated) profiling finds: fixed per config, as on real hardware."""
    return (60 + 5 * config) * GiB


def _open(boot: Boot) -> Any:
    if boot.setup == "per-node":
        return LocalStore(boot.node_dir)
    settings = Settings(
        url=boot.shared_url,
        timeout=boot.timeout,
        local_tier=boot.node_dir,
        storage_options=boot.shared_options,
    )
    return settings.open_store()


def _node_start(shared_url: str) -> None:
    """Pool initializer: load the shared store's client library (see the module doc)."""
    if "://" in shared_url and not shared_url.startswith("file://"):
        from plancache.backends import s3  # noqa: F401


def boot_node(boot: Boot) -> dict[str, Any]:
    """Run one simulated boot; returns what happened and how long each part took."""
    time.sleep(boot.delay)
    start = time.perf_counter()
    factors = config_factors(boot.config)
    lookup_seconds = None
    reason = "no-plans"
    applied = None
    if boot.setup != "none":
        cache = PlanCache(lambda: _open(boot), timeout=boot.timeout)
        decision = cache.lookup(factors, boot.free_memory)
        lookup_seconds, reason, applied = decision.seconds, decision.reason, decision.hit
    profiled = not applied
    if profiled:
        time.sleep(boot.profile_seconds)
        if boot.setup != "none":
            cache.record(
                factors,
                kv_cache_memory_bytes=profiled_kv(boot.config),
                free_memory_baseline=boot.free_memory,
            )
    return {
        "setup": boot.setup,
        "round": boot.round,
        "node": boot.node,
        "config": boot.config,
        "reason": reason,
        "profiled": profiled,
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
            applicable += plan.free_memory_baseline <= boot.free_memory
    return {"nodes_with_valid_plan": valid, "nodes_whose_plan_applies": applicable}


def simulate(
    work_dir: Path,
    shared_url: str,
    shared_options: dict[str, Any],
    *,
    nodes: int = 32,
    configs: int = 4,
    profile_seconds: float = 2.0,
    arrival_window: float = 6.0,
    rounds: int = 2,
    timeout: float = 2.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Run every set-up for ``rounds`` rounds on ``nodes`` processes; returns the figures."""
    rng = random.Random(seed)
    free = [130 * GiB + rng.randint(-256, 256) * (1 << 20) for _ in range(nodes)]
    config_of = [i % configs for i in range(nodes)]
    delays = [rng.uniform(0, arrival_window) for _ in range(nodes)]
    ctx = multiprocessing.get_context("spawn")
    results: dict[str, Any] = {
        "simulated": True,
        "nodes": nodes,
        "configs": configs,
        "rounds": rounds,
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
                        config_of[n],
                        delays[n] if rnd == 0 else 0.0,
                        free[n],
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
    }
