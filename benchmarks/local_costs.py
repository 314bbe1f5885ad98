"""Costs of the local store against vLLM's built-in read, and of ``import plancache``.

Baselines, reading the same file: vLLM's built-in read (``vllm_load_plan``: what
``vllm/v1/worker/startup_plan.py`` in vLLM 0.33.0 does, step for step: the path from
``VLLM_CACHE_ROOT`` as ``vllm.envs`` derives it while booting, ``open`` + ``json.load``, the
schema and fingerprint checks), and its core alone (``open`` + ``json.load``). The plancache
hit path reads the same bytes, decodes with orjson and validates every rule (fingerprint
recomputed, bounds, schema, every observation).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.factors import worker_factors
from benchmarks.stats import median, percentiles, time_calls, time_interleaved
from plancache import Plan, PlanCache
from plancache._backends.local import LocalStore
from plancache._plan import SCHEMA
from plancache._store import PlanStore
from plancache.testing import GiB

DENIED_MODULES = ("s3fs", "gcsfs", "vllm", "torch", "boto3", "aiobotocore")


def vllm_load_plan(fingerprint: str, schema: int) -> dict[str, Any] | None:
    """vLLM 0.33.0's ``_load_plan(fingerprint)`` (``vllm/v1/worker/startup_plan.py``), with
    ``_plan_path`` and ``envs.VLLM_CACHE_ROOT`` (not yet cached while a worker boots)
    inlined, the same calls in the same order; ``schema`` stands for its
    ``PLAN_SCHEMA_VERSION`` (the plans read here are plancache's). Its warning on an
    unreadable file is left out (no such file here)."""
    root = os.path.expanduser(
        os.getenv(
            "VLLM_CACHE_ROOT",
            os.path.join(
                os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
                "vllm",
            ),
        )
    )
    path = os.path.join(root, "startup_plan", f"startup_plan_{fingerprint}.json")
    try:
        with open(path) as f:
            plan: dict[str, Any] = json.load(f)
    except (OSError, json.JSONDecodeError):  # vLLM: None for both (a missing file, unreadable)
        return None
    if plan.get("schema") != schema or plan.get("fingerprint") != fingerprint:
        return None
    return plan


def measure_local(n: int = 2000) -> dict[str, Any]:
    """p50/p99 on a fresh directory: get hit and miss beside the two baselines (interleaved),
    then ``PlanCache`` lookup hit and miss (interleaved); put create, kept (the same plan
    again) and merge (a dominating plan replaces), and ``PlanCache.record`` (create).
    ``VLLM_CACHE_ROOT`` is set to the directory while it runs."""

    def plans(kv: int, tag: str = "") -> list[Plan]:
        return [
            Plan.new(
                worker_factors(f"{tag}{i}"),
                kv_cache_memory_bytes=kv,
                free_memory_baseline=130 * GiB,
            )
            for i in range(n + 20)
        ]

    with tempfile.TemporaryDirectory(prefix="plancache-bench-") as tmp:
        layer = LocalStore(Path(tmp) / "startup_plan")
        store = PlanStore(layer)
        base, better = plans(60 * GiB), plans(61 * GiB)
        cache = PlanCache(store)
        writes = {
            "put_create": time_calls(lambda i: store.put(base[i]), n),
            "put_kept": time_calls(lambda i: store.put(base[i]), n),
            "put_merge": time_calls(lambda i: store.put(better[i]), n),
            "record": time_calls(
                lambda i: cache.record(
                    worker_factors(f"record-{i}"),
                    kv_cache_memory_bytes=60 * GiB,
                    free_memory_baseline=130 * GiB,
                ),
                n,
            ),
        }
        hit_fp = better[0].fingerprint
        path = layer.root / f"startup_plan_{hit_fp}.json"

        def baseline() -> object:
            with open(path) as f:
                return json.load(f)

        def vllm_read() -> object:
            plan = vllm_load_plan(hit_fp, SCHEMA)
            assert plan is not None
            return plan

        hit_factors, miss_factors = dict(better[0].factors), worker_factors("miss")
        with mock.patch.dict(os.environ, {"VLLM_CACHE_ROOT": tmp}):
            reads = time_interleaved(
                {
                    "baseline_vllm_load_plan": vllm_read,
                    "baseline_open_json_load": baseline,
                    "get_hit": lambda: store.get(hit_fp),
                    "get_miss": lambda: store.get("f" * 64),
                },
                n,
            )
        # apart: a lookup's background job still finishing would slow whatever runs next
        reads |= time_interleaved(
            {
                "lookup_hit": lambda: cache.lookup(hit_factors, 140 * GiB),
                "lookup_miss": lambda: cache.lookup(miss_factors, 140 * GiB),
            },
            n,
        )
        record_bytes = len(base[0].encode())
    result: dict[str, Any] = {"record_bytes": record_bytes}
    result.update({name: percentiles(samples) for name, samples in reads.items()})
    result.update({name: percentiles(samples) for name, samples in writes.items()})
    hit = result["get_hit"]["p50_us"]
    result["hit_over_vllm_read_p50"] = hit / result["baseline_vllm_load_plan"]["p50_us"]
    result["hit_over_open_json_load_p50"] = hit / result["baseline_open_json_load"]["p50_us"]
    return result


_PROBE = (
    "import sys, time; t = time.perf_counter(); import plancache; d = time.perf_counter() - t; "
    "print(d, *[m for m in {denied!r} if m in sys.modules])"
)


def _process_seconds(args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    return time.perf_counter() - start, out


def measure_import(runs: int = 15) -> dict[str, Any]:
    """What ``import plancache`` adds to a fresh interpreter (median wall time of whole
    processes, and the in-process import time), and which heavy modules it loaded."""
    bare, timed, inside = [], [], []
    loaded: set[str] = set()
    for _ in range(runs):
        bare.append(_process_seconds([sys.executable, "-c", "pass"])[0])
        seconds, out = _process_seconds(
            [sys.executable, "-c", _PROBE.format(denied=DENIED_MODULES)]
        )
        timed.append(seconds)
        first, *heavy = out.split()
        inside.append(float(first))
        loaded.update(heavy)
    return {
        "runs": runs,
        "bare_interpreter_ms": median(bare) * 1e3,
        "interpreter_with_import_ms": median(timed) * 1e3,
        "added_ms": (median(timed) - median(bare)) * 1e3,
        "in_process_import_ms": median(inside) * 1e3,
        "heavy_modules_loaded": sorted(loaded),
    }
