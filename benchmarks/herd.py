"""Requests per node against the store's state: a rollout's herd on S3 healthy, slowed
tenfold, stalled for 20 s, and refusing every request.

N nodes arrive over a window, each a thread running plancache's real code on its own local
directory (its own verdicts and tiers): the store warmed (the conformance round starts), the
plan looked up while the weights load, on a miss the profiled observation recorded, then a
report of its boot written; every write waits for the verdict as the plugin's do (within
``guarded.WRITE_PATIENCE_S`` and ``MAX_ROUNDS``), with plancache's own constants. The store
is moto (its own process) behind ``NodeCounts``, an ``S3UnderLoad`` that counts each node's
requests by its user agent. Per state: requests per node (mean, max) and by what they were
for (shared-verdict reads, probe claims, probe requests, plan requests, reports), 503s, the
lookups' reasons, when the first plan was uploaded (after the store answered again), and
how many nodes arriving after that hit.

SIMULATED: the weights' loading and the profile (sleeps); one plan key for the fleet.
``python -m benchmarks.herd [--nodes N] [--window S]``; ``python -m benchmarks --all`` runs it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.console import log_to_stderr
from plancache import PlanCache, PlanStoreError, open_store
from plancache._backends._remote import PROBE_PREFIX
from plancache._backends.tiered import TieredStore
from plancache._config import Settings
from plancache._keys import fingerprint
from plancache.testing import FACTORS, GiB
from plancache.testing.servers import (
    SLOW_DOWN,
    MotoS3,
    MotoS3Process,
    S3UnderLoad,
    fake_aws_env,
)

AGENT = re.compile(r"herd-node/(\d+)")
HEALTHY_DELAY_S = 0.02
"""Latency of every request on the healthy store (as the rollout's ``Load``)."""
WEIGHTS_S = 3.0
"""SIMULATED seconds a node's weights load (its lookup runs meanwhile)."""


STALL_HOLD_S = 5.0
"""Seconds a stalled store holds a request (past the clients' 3 s bound) before dropping it."""


@dataclass(frozen=True)
class State:
    """How the store behaves: ``delay_s`` on every request; for ``stall_s`` from the window's
    start, no answer within the clients' bounds (``NodeCounts.stall``); with ``refuses``,
    HTTP 503 SlowDown to every request."""

    name: str
    delay_s: float = HEALTHY_DELAY_S
    stall_s: float = 0.0
    refuses: bool = False


STATES = (
    State("healthy"),
    State("slowed tenfold", delay_s=10 * HEALTHY_DELAY_S),
    State("stalled for 20 s", stall_s=20.0),
    State("refusing (503)", refuses=True),
)


class NodeCounts(S3UnderLoad):
    """``S3UnderLoad`` that counts each node's requests (``herd-node/<n>`` in its user
    agent: ``node_options``) and what each request was for (``kind``), and may stall."""

    def __init__(self, upstream: str, state: State | None = None) -> None:
        state = state or State("healthy", delay_s=0.0)
        limit = 0 if state.refuses else 100_000
        super().__init__(upstream, delay_s=state.delay_s, reads_per_s=limit, writes_per_s=limit)
        self.by_node: collections.Counter[int] = collections.Counter()
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.probe_keys: set[str] = set()
        """Probe keys written: three per probe (two for one the store cut short)."""
        self.first_upload: float | None = None
        """When (``time.monotonic``) the first write of a plan arrived."""
        self._stalled_until = 0.0

    def stall(self, until: float) -> None:
        """Until ``until`` (``time.monotonic``), hold each request ``STALL_HOLD_S`` (past the
        clients' bounds), then drop it: answered 503, never forwarded, as a store that
        stalls serves no backlog to clients gone (the store is measured, not this proxy)."""
        self._stalled_until = until

    def handle(self, h: Any, body: bytes) -> None:
        left = self._stalled_until - time.monotonic()
        if left <= 0:
            super().handle(h, body)
            return
        time.sleep(min(left, STALL_HOLD_S))
        with contextlib.suppress(OSError):  # the client gave up
            h.reply(503, {"Content-Type": "application/xml"}, SLOW_DOWN)

    def answer(self, h: Any) -> None:
        found = AGENT.search(h.headers.get("User-Agent", ""))
        path = h.path.split("?")[0]
        with self._lock:
            self.by_node[int(found.group(1)) if found else -1] += 1
            self.by_kind[kind(path)] += 1
            if h.command == "PUT" and f"{PROBE_PREFIX}/startup_plan_" in path:
                self.probe_keys.add(path)
            if h.command == "PUT" and kind(path) == "plans" and self.first_upload is None:
                self.first_upload = time.monotonic()
        super().answer(h)


def kind(path: str) -> str:
    """What a request on ``path`` was for."""
    if path.endswith("verdict.json"):
        return "verdict reads"
    if path.endswith("verdict.json.claim"):
        return "probe claims"
    if PROBE_PREFIX in path:
        return "probe"
    if "/boot-" in path:
        return "reports"
    return "plans"


def node_options(endpoint: str, node: int) -> dict[str, Any]:
    """Storage options of node ``node`` on ``endpoint``: its requests carry its number."""
    return {"endpoint_url": endpoint, "config_kwargs": {"user_agent_extra": f"herd-node/{node}"}}


def boot(
    url: str,
    options: dict[str, Any],
    root: Path,
    node: int,
    *,
    weights_s: float = WEIGHTS_S,
    write_patience: float | None = None,
) -> str:
    """One node's boot (see the module): the lookup's reason. Each write waits for the
    verdict within the write patience (None: ``guarded.WRITE_PATIENCE_S``), as a process
    that keeps serving does (the record's wait is not cut at a budget)."""
    settings = Settings(
        url,
        timeout=600.0,
        local_tier=str(root / f"n{node}"),
        storage_options=options,
        write_patience=write_patience,
    )
    cache = PlanCache.from_settings(settings)
    cache.warm()
    pending = cache.start_lookup(FACTORS, 50 * GiB)
    time.sleep(weights_s)
    decision = pending.result(2.0)  # the plugin's join: PLANCACHE_TIMEOUT
    if not decision.hit:
        cache.record(FACTORS, kv_cache_memory_bytes=4 * GiB, free_memory_baseline=40 * GiB)
    store = cache.store
    assert isinstance(store, TieredStore)
    with contextlib.suppress(PlanStoreError):  # its boot report, as every boot writes one
        store.remote.layer.write_object(f"boot-{node}.json", [b"{}"])
    return decision.reason.value


def rollout(moto: MotoS3, work: Path, state: State, nodes: int, window: float) -> dict[str, Any]:
    """``nodes`` nodes arriving evenly over ``window`` seconds on a fresh bucket of ``moto``
    whose store behaves as ``state``: the figures of the module."""
    bucket = f"herd-{len(list(work.iterdir()))}-{int(time.time() * 1e3)}"
    moto.create_bucket(bucket)
    url = f"s3://{bucket}/plans"
    reasons: dict[int, str] = {}
    with NodeCounts(moto.endpoint, state) as proxy:
        start = time.monotonic()
        proxy.stall(start + state.stall_s)

        def one(n: int) -> None:
            time.sleep(max(0.0, start + n * window / nodes - time.monotonic()))
            reasons[n] = boot(url, node_options(proxy.endpoint, n), work / bucket, n)

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(nodes)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(900)
        wall = time.monotonic() - start
        per_node = [proxy.by_node[n] for n in range(nodes)]
        by_kind, probes, throttled = dict(proxy.by_kind), len(proxy.probe_keys), proxy.throttled
        upload = None if proxy.first_upload is None else proxy.first_upload - start
    stored = open_store(url, endpoint_url=moto.endpoint).get(fingerprint(FACTORS))
    recovered = [n for n in range(nodes) if n * window / nodes >= state.stall_s]
    return {
        "state": asdict(state),
        "nodes": nodes,
        "window_s": window,
        "requests": sum(per_node),
        "per_node_mean": sum(per_node) / nodes,
        "per_node_max": max(per_node),
        "by_kind_per_node": {k: v / nodes for k, v in sorted(by_kind.items())},
        "probe_keys_written": probes,
        "throttled": throttled,
        "lookups": dict(collections.Counter(reasons.values())),
        "plan_stored": stored is not None,
        "first_upload_after_recovery_s": None if upload is None else upload - state.stall_s,
        "hits_of_nodes_after_recovery": f"{sum(reasons[n] == 'hit' for n in recovered)} of "
        f"{len(recovered)}",
        "wall_s": wall,
        "simulated": "loading weights (sleeps); one plan key",
    }


def measure(nodes: int = 40, window: float = 40.0) -> dict[str, Any]:
    """One rollout per state (``STATES``) on one moto server in its own process."""
    out: dict[str, Any] = {"nodes": nodes, "window_s": window, "runs": {}}
    with fake_aws_env(), MotoS3Process() as moto, tempfile.TemporaryDirectory() as work:
        for state in STATES:
            out["runs"][state.name] = rollout(moto, Path(work), state, nodes, window)
    return out


def table(results: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    head = (
        "| store | requests per node (mean / max) | verdict reads | probe claims | probe "
        "| plans | reports | probes | lookups | first plan upload | hits after recovery |"
    )
    lines = [head, "|" + "---|" * 11]
    for name, r in results["runs"].items():
        k = r["by_kind_per_node"]
        after = r["first_upload_after_recovery_s"]
        upload = "none" if after is None else f"{after:.1f} s"
        if after is not None and r["state"]["stall_s"]:
            upload += " after the store answered"
        lookups = ", ".join(f"{n} {why}" for why, n in sorted(r["lookups"].items()))
        cells = [
            name,
            f"{r['per_node_mean']:.1f} / {r['per_node_max']}",
            *(f"{k.get(x, 0.0):.2f}" for x in ("verdict reads", "probe claims", "probe")),
            *(f"{k.get(x, 0.0):.2f}" for x in ("plans", "reports")),
            f"{r['probe_keys_written'] / 3:.1f}",
            lookups,
            upload,
            r["hits_of_nodes_after_recovery"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.herd", description=__doc__)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    log_to_stderr()
    results = measure(args.nodes, args.window)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
