"""The main job: what plancache saves at boot, and what it costs, measured on this machine.

``python -m benchmarks`` runs the compile-artifact boots first (real vLLM compiles on this
CPU, in fresh processes, when a Python with vLLM is present: ``compile_share``), then the
local store costs, ``import plancache`` cost, the vLLM plugin's critical-path cost, the fleet
sweep, a rollout of 1,000 nodes against S3 under load beside the same rollout without
plancache (``benchmarks.rollout``), and the real-boot benchmark when
a GPU and vLLM are present (else it says it is skipped and why). The terminal shows one line
per stage and ends with one table of the headline results; ``results.json`` (every figure),
``tables.txt`` (every table), ``results.png`` and ``bench.log`` (what the stages, their
worker processes and the libraries printed) go to ``--out``. Exit status 1 when a stage
failed (the others still run and are saved).

``--all`` adds what the main job leaves out to stay within 8 minutes with its set-up: S3
and GCS store costs on loopback servers it starts itself, write contention on one key, the
32-process fleet simulation, requests per node of a herd against the store's state (``herd``),
a plain ``torch.compile`` program on a new machine through ``plancache run`` against warm,
hand-copied and mega-cache runs (``torch_run``, three runs: about a minute each where the
machine is idle), and, in the compile stage, a hit's and a miss's cost per store and the
memory check (``ALL_ONLY``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    boot,
    compile_share,
    console,
    contention,
    fleet,
    herd,
    local_costs,
    machine,
    plugin_costs,
    report,
    rollout,
    store_costs,
    torch_run,
)
from plancache.testing import servers

ALL_ONLY = ("remote", "contention", "herd", "fleet", "torch")
"""Stages only ``--all`` runs (``--fleet-only`` runs the fleet too)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--samples", type=int, default=2000, help="timed calls per local op")
    parser.add_argument("--remote-samples", type=int, default=100, help="per S3/GCS op")
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
        "--fleet-timeout",
        type=float,
        default=2.0,
        help="seconds each fleet node's lookup and record may take (PLANCACHE_TIMEOUT)",
    )
    parser.add_argument(
        "--rollouts",
        default="1000:90",
        help="rollout simulations, as NODES:WINDOW_SECONDS,... (empty: none)",
    )
    parser.add_argument(
        "--fleet-only",
        action="store_true",
        help="run only the fleet simulation, sweep and rollouts",
    )
    parser.add_argument(
        "--no-remote",
        action="store_true",
        help="skip S3/GCS servers (fleet then shares a local directory)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compile-artifact boots")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also S3/GCS store costs, write contention, the fleet simulation, and a hit's and "
        "a miss's cost and the memory check in the compile stage (not in the main job)",
    )
    parser.add_argument(
        "--compile-memory-mib", type=int, default=256, help="artifact size of the memory check"
    )
    return parser


def _measure(run: console.Run, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Every stage, in order; each one's figures land in ``results`` if it succeeded."""

    def compile_artifacts() -> None:
        with tempfile.TemporaryDirectory(prefix="plancache-compile-") as work:
            results["compile"] = compile_share.measure(
                Path(work), args.compile_memory_mib, costs=args.all
            )

    def local() -> None:
        results["stores"]["local"] = local_costs.measure_local(args.samples)

    def imported() -> None:
        results["import"] = local_costs.measure_import()

    def remote() -> None:
        results["stores"].update(store_costs.measure_remote(args.remote_samples))

    def plugin() -> None:
        results["plugin_costs"] = plugin_costs.measure()

    def torch_program() -> None:
        with tempfile.TemporaryDirectory(prefix="plancache-torch-run-") as work:
            results["torch_run"] = torch_run.measure(Path(work), runs=3)

    def contended() -> None:
        remote = ("s3", "gcs")
        suite = {b: n for b, n in contention.SUITE.items() if not (args.no_remote and b in remote)}
        results["contention"] = contention.measure(suite)

    def herded() -> None:
        results["herd"] = herd.measure()

    stages = {
        "compile": ("compile artifacts: real vLLM compiles on this CPU", compile_artifacts),
        "import": ("import plancache in a fresh interpreter", imported),
        "local": (f"local store, {args.samples} calls per operation", local),
        "remote": ("S3 and GCS store costs on loopback servers", remote),
        "plugin": ("the vLLM plugin's critical-path cost, local / S3 / GCS", plugin),
        "contention": ("write contention on one key", contended),
        "torch": ("a torch.compile program on a new machine: plancache run, 3 runs", torch_program),
        "herd": ("requests per node against the store's state, 40 nodes", herded),
    }
    for name, (what, measure) in stages.items():
        if args.fleet_only:
            run.skip(name, what, "--fleet-only")
        elif args.no_compile and name == "compile":
            run.skip(name, what, "--no-compile")
        elif args.no_remote and name in ("remote", "plugin", "herd"):
            run.skip(name, what, "--no-remote")
        elif name in ALL_ONLY and not args.all:
            run.skip(name, what, "not in the main job: --all")
        else:
            run.stage(name, what, measure)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plancache-fleet-")))
        results["fleet_store"] = "local directory" if args.no_remote else "s3 (moto, loopback)"

        def simulate() -> None:
            shared_options: dict[str, Any]
            if args.no_remote:
                shared_url, shared_options = f"file://{work}/shared", {}
            else:
                shared_url, shared_options = stack.enter_context(servers.s3_server())
            results["fleet"] = fleet.simulate(
                work,
                shared_url,
                shared_options,
                nodes=args.nodes,
                configs=args.configs,
                profile_seconds=args.profile_seconds,
                arrival_window=args.arrival_window,
                rounds=args.rounds,
                timeout=args.fleet_timeout,
            )

        def sweep() -> None:
            results["fleet_sweep"] = fleet.sweep(
                work,
                args.seeds,
                nodes=args.nodes,
                configs=args.configs,
                rounds=args.rounds,
                profile_seconds=args.profile_seconds,
                arrival_window=args.arrival_window,
            )

        fleet_what = f"fleet simulation: {args.nodes} processes, {args.rounds} rounds, "
        if args.all or args.fleet_only:
            run.stage("fleet", fleet_what + results["fleet_store"], simulate)
        else:
            run.skip("fleet", fleet_what + results["fleet_store"], "not in the main job: --all")
        sweep_what = f"fleet sweep: {args.seeds} fleets, before and after (simulated time)"
        run.stage("sweep", sweep_what, sweep)
        sizes = tuple(
            (int(n), float(w)) for n, w in (x.split(":") for x in args.rollouts.split(",") if x)
        )

        def rollouts() -> None:
            results["rollout"] = rollout.measure(work / "rollout", sizes)

        what = "rollouts: " + ", ".join(f"{n} nodes in {w:g} s" for n, w in sizes)
        if not sizes:
            run.skip("rollout", "rollouts", "--rollouts is empty")
        elif args.no_remote:
            run.skip("rollout", what, "--no-remote")
        else:
            run.stage("rollout", what + " on S3 under load", rollouts)
    reason = boot.skip_reason()
    results["boot"] = f"skipped: {reason}" if reason else "available: run python -m benchmarks.boot"
    run.skip("boot", "real vLLM boots on a GPU", reason or "not in the main job")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    files = report.outputs(args.out)
    start = time.monotonic()
    results: dict[str, Any] = {**report.provenance(), "machine": machine.describe(), "stores": {}}
    with console.Run(files["log"]) as run:
        _measure(run, args, results)
        results["stages"] = run.stages
        what = "the plot, " + files[report.PLOT].name
        if importlib.util.find_spec("matplotlib") is None:
            why = "matplotlib is not installed: pip install 'plancache[bench]'"
            run.skip(report.PLOT, what, why)
        else:
            run.stage(report.PLOT, what, lambda: report.plot(results, files[report.PLOT]))
        results["wall_seconds"] = time.monotonic() - start
        results["failed"] = run.failed()
        report.write_json(results, files["figures"])
        files["tables"].write_text(report.table(results) + "\n")
    print(report.summary(results, run.log_counts(), files["log"]))
    print()
    print(report.headline(results))
    print()
    print(report.paths(files, run.stages))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
