"""Small timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 (nearest rank) of ``samples``, in microseconds, plus the count."""
    ordered = sorted(samples)
    if not ordered:
        return {"n": 0, "p50_us": float("nan"), "p99_us": float("nan")}

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] * 1e6

    return {"n": len(ordered), "p50_us": rank(0.50), "p99_us": rank(0.99)}


def time_calls(fn: Callable[[int], object], n: int, warmup: int = 20) -> list[float]:
    """Wall-clock seconds of ``fn(i)`` for i in range(n), after ``warmup`` untimed calls."""
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def time_interleaved(
    fns: dict[str, Callable[[], object]], n: int, warmup: int = 20
) -> dict[str, list[float]]:
    """Seconds per call of each function, calls interleaved so that load from elsewhere on
    the machine falls on all of them alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - start)
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
