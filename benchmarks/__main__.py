"""The main job: what plancache saves at boot, and what it costs, measured on this machine.

``python -m benchmarks`` runs the compile-artifact boots first (real vLLM compiles on this
CPU, in fresh processes, when a Python with vLLM is present: ``compile_share``), then the
local store costs, ``import plancache`` cost, S3 and GCS costs on loopback servers it starts
itself, write contention on one key, the fleet simulation, and the real-boot benchmark when
a GPU and vLLM are present (else it says it is skipped and why). It writes a table to the
terminal, ``results.json`` and ``results.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    boot,
    compile_share,
    contention,
    fleet,
    local_costs,
    machine,
    plugin_costs,
    report,
    store_costs,
)
from plancache.testing import servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--samples", type=int, default=2000, help="timed calls per local op")
    parser.add_argument("--remote-samples", type=int, default=200, help="per S3/GCS op")
    parser.add_argument("--nodes", type=int, default=32, help="fleet worker processes")
    parser.add_argument("--configs", type=int, default=4, help="distinct fingerprints")
    parser.add_argument(
        "--profile-seconds",
        type=float,
        default=0.2,
        help="SIMULATED profiling time (short to keep the run short; vLLM's maintainers "
        "measured ~2 s for Qwen3-8B on an H100)",
    )
    parser.add_argument("--arrival-window", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4, help="fleet restarts (>= 4)")
    parser.add_argument("--seeds", type=int, default=10, help="fleets in the before/after sweep")
    parser.add_argument(
        "--fleet-only", action="store_true", help="run only the fleet simulation and sweep"
    )
    parser.add_argument(
        "--no-remote",
        action="store_true",
        help="skip S3/GCS servers (fleet then shares a local directory)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compile-artifact boots")
    parser.add_argument(
        "--compile-memory-mib", type=int, default=1024, help="artifact size of the memory check"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results: dict[str, Any] = {"machine": machine.describe(), "stores": {}}
    if not (args.no_compile or args.fleet_only):
        print("measuring compile artifacts: real vLLM boots on this CPU ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="plancache-compile-") as compile_work:
            results["compile"] = compile_share.measure(Path(compile_work), args.compile_memory_mib)
    if not args.fleet_only:
        print("measuring import cost ...", flush=True)
        results["import"] = local_costs.measure_import()
        print("measuring the local store ...", flush=True)
        results["stores"]["local"] = local_costs.measure_local(args.samples)
    if not args.no_remote and not args.fleet_only:
        print("measuring S3 and GCS on loopback servers ...", flush=True)
        results["stores"].update(store_costs.measure_remote(args.remote_samples))
        print("measuring the vLLM plugin's critical-path cost ...", flush=True)
        results["plugin_costs"] = plugin_costs.measure()
    if not args.fleet_only:
        print("measuring write contention on one key ...", flush=True)
        remote = ("s3", "gcs")
        suite = {b: n for b, n in contention.SUITE.items() if not (args.no_remote and b in remote)}
        results["contention"] = contention.measure(suite)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plancache-fleet-")))
        shared_options: dict[str, Any]
        if args.no_remote:
            shared_url, shared_options = f"file://{work}/shared", {}
        else:
            shared_url, shared_options = stack.enter_context(servers.s3_server())
        results["fleet_store"] = "local directory" if args.no_remote else "s3 (moto, loopback)"
        print(f"simulating the fleet ({results['fleet_store']}) ...", flush=True)
        results["fleet"] = fleet.simulate(
            work,
            shared_url,
            shared_options,
            nodes=args.nodes,
            configs=args.configs,
            profile_seconds=args.profile_seconds,
            arrival_window=args.arrival_window,
            rounds=args.rounds,
        )
        print(f"sweeping {args.seeds} fleets, before and after (simulated time) ...", flush=True)
        results["fleet_sweep"] = fleet.sweep(
            work,
            args.seeds,
            nodes=args.nodes,
            configs=args.configs,
            rounds=args.rounds,
            profile_seconds=args.profile_seconds,
            arrival_window=args.arrival_window,
        )
    reason = boot.skip_reason()
    results["boot"] = f"skipped: {reason}" if reason else "available: run python -m benchmarks.boot"
    results["wall_seconds"] = time.monotonic() - start
    print()
    if "compile" in results:
        print(compile_share.table(results["compile"]))
        print()
    print(report.table(results))
    if "plugin_costs" in results:
        print()
        print(plugin_costs.table(results["plugin_costs"]))
    report.write_json(results, args.out / "results.json")
    report.plot(results, args.out / "results.png")
    print(
        f"\nwrote {args.out / 'results.json'} and {args.out / 'results.png'} "
        f"in {results['wall_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
