"""The vLLM plugin's critical-path cost per boot, before and after the fetch moved into
weight loading and the save into a daemon thread.

- before: the lookup ran at ``determine_available_memory`` (``PlanCache.lookup``: the store's
  full latency on the critical path) and the save ran after warm-up (``PlanCache.record``);
- after: the store is opened in the background first (``PlanCache.warm``, as the plugin does
  when vLLM imports its worker module), the lookup starts when ``load_model`` is entered
  (``PlanCache.start_lookup``, whose thread runs ``Breaker.recover`` on a local directory
  before the fetch), the weights load (simulated by a sleep), then
  ``determine_available_memory`` only joins it (``PendingLookup.result``) and, on a hit,
  writes the crash mark (``Breaker.arm``: a locked file, fsynced in the background); the save
  only hands a job to a background thread (``plancache._background``). ``disarm``: removing
  the mark after the warm-up, on a hit.

On the local store, S3 (moto) and GCS (fake-gcs-server) on loopback, each with 0 and 300 ms
added to every request by a delaying proxy. Run: ``python -m benchmarks.plugin_costs``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from benchmarks.stats import median
from plancache import PlanCache, open_store
from plancache import _background as background
from plancache._breaker import Breaker
from plancache.testing.servers import gcs_server, s3_server, with_latency

FACTORS: dict[str, Any] = {"model": "bench/plugin-costs", "rank": 0}
FREE = 80 << 30
KV = 40 << 30


def _ms(fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Milliseconds ``fn(*args, **kwargs)`` took."""
    start = time.perf_counter()
    fn(*args, **kwargs)
    return (time.perf_counter() - start) * 1e3


def _after(
    cache: PlanCache, breaker: Breaker, factors: dict[str, Any], load_s: float
) -> tuple[float, float]:
    """Critical-path ms of the new flow (recover crash marks and start the fetch, load
    weights, join and arm on a hit), and of removing the mark after the warm-up."""
    cache.warm()
    time.sleep(0.01)  # vLLM initialises the device between importing the worker and loading
    start = time.perf_counter()
    pending = cache.start_lookup(factors, FREE, avoid=lambda key: breaker.recover(cache, key))
    started = (time.perf_counter() - start) * 1e3
    time.sleep(load_s)  # the weights load
    start = time.perf_counter()
    decision = pending.result(cache.timeout)
    mark = None
    if decision.observation is not None and decision.fingerprint is not None:
        mark = breaker.arm(decision.fingerprint, decision.observation)
    joined = (time.perf_counter() - start) * 1e3
    return started + joined, _ms(breaker.disarm, mark)


def measure_store(
    make: Callable[[], PlanCache], load_s: float, runs: int
) -> dict[str, dict[str, float]]:
    """Median critical-path milliseconds of hit, miss and save, before and after. Every
    figure uses a fresh cache, as a fresh boot does (client set-up included)."""
    out: dict[str, list[float]] = {}
    size = {"kv_cache_memory_bytes": KV, "free_memory_baseline": FREE}
    with tempfile.TemporaryDirectory(prefix="plancache-marks-") as marks:
        breaker = Breaker(marks)
        for run in range(runs):
            factors = {**FACTORS, "run": run}
            figures = {
                "miss before": _ms(make().lookup, factors, FREE),
                "save before": _ms(make().record, factors, **size),
                "hit before": _ms(make().lookup, factors, FREE),
            }
            figures["hit after"], figures["disarm"] = _after(make(), breaker, factors, load_s)
            figures["miss after"], _ = _after(make(), breaker, {**factors, "new": 1}, load_s)
            figures["save after"] = _save_after(make(), factors, size)
            for name, value in figures.items():
                out.setdefault(name, []).append(value)
    return {name: {"median_ms": median(values)} for name, values in out.items()}


def _save_after(cache: PlanCache, factors: dict[str, Any], size: dict[str, int]) -> float:
    """Critical-path ms of the new save: handing it to a background thread."""
    start = time.perf_counter()
    job = background.start(
        lambda: cache.record(
            {**factors, "saved-after": True},
            kv_cache_memory_bytes=size["kv_cache_memory_bytes"],
            free_memory_baseline=size["free_memory_baseline"],
        )
    )
    spent = (time.perf_counter() - start) * 1e3
    job.join(30)
    return spent


@contextmanager
def _stores(delay_s: float) -> Iterator[dict[str, Callable[[], PlanCache]]]:
    with ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="plancache-costs-"))
        makers: dict[str, Callable[[], PlanCache]] = {}
        if delay_s == 0:
            makers["local"] = lambda: PlanCache(lambda: open_store(directory), timeout=5)
        for name, server in (("s3", s3_server), ("gcs", gcs_server)):
            url, opts = stack.enter_context(with_latency(stack.enter_context(server()), delay_s))
            makers[name] = lambda u=url, o=opts: PlanCache(  # type: ignore[misc]
                lambda: open_store(u, **o), timeout=5
            )
        yield makers


def measure(load_s: float = 1.0, runs: int = 2) -> dict[str, Any]:
    """Figures for every store, with 0 and 300 ms of added latency per request."""
    results: dict[str, Any] = {"load_s": load_s, "runs": runs, "stores": {}}
    for delay_s in (0.0, 0.3):
        with _stores(delay_s) as makers:
            for name, make in makers.items():
                label = f"{name} +{delay_s * 1e3:.0f} ms"
                print(f"  plugin costs on {label} ...", flush=True)
                results["stores"][label] = measure_store(make, load_s, runs)
    return results


def table(results: dict[str, Any]) -> str:
    """A text table: rows are stores, columns the critical-path milliseconds."""
    columns = ["hit before", "hit after", "miss before", "miss after", "save before", "save after"]
    columns.append("disarm")
    lines = [
        f"plugin critical-path cost (median ms, weight load {results['load_s']} s)",
        f"{'store':<14}" + "".join(f"{c:>13}" for c in columns),
    ]
    for store, figures in results["stores"].items():
        cells = "".join(f"{figures[c]['median_ms']:>13.2f}" for c in columns)
        lines.append(f"{store:<14}{cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(measure(runs=5)))
