"""Real boots of vLLM in fresh processes (the way ``vllm bench startup`` times them).

Needs a CUDA GPU and vLLM with the plancache plugin installed (``pip install
'plancache[vllm,bench]'``). Each variant runs with CUDA graphs (the default) and with
``--enforce-eager`` (a hit saves seconds with graphs, little eager), with one untimed boot
first and then ``--runs`` timed warm boots; each boot's plancache decision (hit, miss, ...)
is read from its events (``PLANCACHE_EVENTS=1``: one JSON line per event on standard error):

- ``off``: no startup plans; vLLM profiles every boot.
- ``builtin``: vLLM's own ``VLLM_ENABLE_STARTUP_PLAN=1`` (plancache disabled).
- ``plancache``: plancache on a shared S3 store (moto on 127.0.0.1) with a local tier.
- ``new-node``: plancache, local tier emptied before every boot, plan only in the shared store.

Compile artifacts (``run_compile``; each boot with CUDA graphs, ``--runs`` timed boots):

- ``compile-cold``: an empty ``VLLM_CACHE_ROOT`` every boot, sharing off: vLLM compiles.
- ``compile-warm``: the same ``VLLM_CACHE_ROOT`` every boot: vLLM's own compile cache.
- ``compile-new-node``: an empty ``VLLM_CACHE_ROOT`` every boot; the artifact comes from the
  shared S3 store (moto on 127.0.0.1), uploaded by one untimed boot first.

Run: ``python -m benchmarks.boot --model Qwen/Qwen3-0.6B --runs 3``. Without a GPU or vLLM it
says why it is skipped and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import gpus
from benchmarks.stats import median
from plancache import _events as events

CHILD = """
import json, sys, time
start = time.perf_counter()
from vllm import LLM
llm = LLM(
    model=sys.argv[1],
    gpu_memory_utilization=float(sys.argv[2]),
    enforce_eager=sys.argv[3] == "eager",
)
print("BOOT_SECONDS", json.dumps(time.perf_counter() - start), flush=True)
"""


def skip_reason() -> str | None:
    """Why the real-boot benchmark cannot run here, or None if it can."""
    if not gpus():
        return "no CUDA GPU on this machine (nvidia-smi lists none)"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (pip install 'plancache[vllm]')"
    return None


def decisions(log: str) -> list[str]:
    """Each rank's plancache decision from a boot's events (``PLANCACHE_EVENTS=1``: the
    ``boot`` event of each rank, ``plancache._events``): ``hit`` (``hit:provisional`` for a
    provisional plan), else its reason (``explicit``, ``miss``, ``gate:...``); empty when
    plancache was off."""
    found = []
    for event in events.read(log):
        if event.get("event") == "boot":
            provisional = ":provisional" if event.get("provisional") else ""
            found.append(f"hit{provisional}" if event.get("applied") else str(event["reason"]))
    return found


def _boot(
    model: str, util: float, env: dict[str, str], timeout: float, mode: str
) -> tuple[float, list[str]]:
    """(seconds, plancache decisions) of one boot in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(util), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in out.stdout.splitlines():
        if line.startswith("BOOT_SECONDS"):
            return float(line.split()[1]), decisions(out.stdout + out.stderr)
    raise RuntimeError(f"boot failed (exit {out.returncode}):\n{out.stderr[-4000:]}")


def run(model: str, runs: int, util: float, timeout: float, mode: str) -> dict[str, Any]:
    """Boot ``model`` in every variant (``mode``: "graphs" or "eager"); seconds and
    plancache decisions per timed boot, and medians."""
    from plancache.testing.servers import s3_server

    work = Path(tempfile.mkdtemp(prefix="plancache-boot-"))
    tier = work / "tier"
    base = dict(os.environ, VLLM_ENABLE_STARTUP_PLAN="0", PLANCACHE_ENABLE="0")
    results: dict[str, Any] = {"model": model, "runs": runs, "gpu_memory_utilization": util}
    with s3_server() as (url, options):
        plancache_env = dict(
            base,
            PLANCACHE_ENABLE="1",
            PLANCACHE_EVENTS="1",
            PLANCACHE_URL=f"{url}/boot",
            PLANCACHE_LOCAL_TIER=str(tier),
            PLANCACHE_STORAGE_OPTIONS=json.dumps(options),
        )
        variants = {
            "off": base,
            "builtin": dict(base, VLLM_ENABLE_STARTUP_PLAN="1"),
            "plancache": plancache_env,
            "new-node": plancache_env,
        }
        for name, env in variants.items():
            _boot(model, util, env, timeout, mode)  # untimed: fills compile caches, the plan
            times, seen = [], []
            for _ in range(runs):
                if name == "new-node":
                    shutil.rmtree(tier, ignore_errors=True)
                seconds, decided = _boot(model, util, env, timeout, mode)
                times.append(seconds)
                seen.append(decided)
            results[name] = {"seconds": times, "median_seconds": median(times), "decisions": seen}
            print(
                f"{mode:6s} {name:10s} median {median(times):7.2f} s  runs {times}  "
                f"plancache {seen}",
                flush=True,
            )
    shutil.rmtree(work, ignore_errors=True)
    for name in ("builtin", "plancache", "new-node"):
        results[name]["saved_vs_off_seconds"] = (
            results["off"]["median_seconds"] - results[name]["median_seconds"]
        )
    return results


def run_compile(model: str, runs: int, util: float, timeout: float) -> dict[str, Any]:
    """Boot ``model`` cold, warm and as a new node fed by the shared store (see the module
    docstring); seconds per timed boot, medians, and each case's saving over cold."""
    from plancache.testing.servers import s3_server

    work = Path(tempfile.mkdtemp(prefix="plancache-compile-boot-"))
    results: dict[str, Any] = {"model": model, "runs": runs}
    with s3_server() as (url, options):
        base = dict(
            os.environ,
            PLANCACHE_ENABLE="1",
            PLANCACHE_URL=f"{url}/boot",
            PLANCACHE_LOCAL_TIER="0",
            PLANCACHE_STORAGE_OPTIONS=json.dumps(options),
            PLANCACHE_COMPILE_TRUST_UNSIGNED="1",
        )
        off = dict(base, PLANCACHE_COMPILE_CACHE="0")
        _boot(model, util, dict(off, VLLM_CACHE_ROOT=str(work / "warm")), timeout, "graphs")
        _boot(model, util, dict(base, VLLM_CACHE_ROOT=str(work / "seed")), timeout, "graphs")
        cases = {  # name: (environment, VLLM_CACHE_ROOT of boot i)
            "compile-cold": (off, "cold-{i}"),
            "compile-warm": (off, "warm"),
            "compile-new-node": (base, "new-{i}"),
        }
        for name, (env, root) in cases.items():
            times = [
                _boot(
                    model,
                    util,
                    dict(env, VLLM_CACHE_ROOT=str(work / root.format(i=i))),
                    timeout,
                    "graphs",
                )[0]
                for i in range(runs)
            ]
            results[name] = {"seconds": times, "median_seconds": median(times)}
            print(f"{name:18s} median {median(times):7.2f} s  runs {times}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    cold = results["compile-cold"]["median_seconds"]
    for name in ("compile-warm", "compile-new-node"):
        results[name]["saved_vs_cold_seconds"] = cold - results[name]["median_seconds"]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per boot")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/boot.json"))
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason is not None:
        print(f"real-boot benchmark skipped: {reason}")
        return 0
    start = time.monotonic()
    results: dict[str, Any] = {}
    for mode in ("graphs", "eager"):  # a hit saves seconds with CUDA graphs, little eager
        results[mode] = run(args.model, args.runs, args.gpu_memory_utilization, args.timeout, mode)
    results["compile"] = run_compile(
        args.model, args.runs, args.gpu_memory_utilization, args.timeout
    )
    results["wall_seconds"] = time.monotonic() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
