"""A new machine as fast as a warm one: a plain PyTorch program (``torch_program.py``: a
small MLP, forward and backward under ``torch.compile``, torch 2.13 on this CPU) shared
through ``plancache run``, against the anchors a PyTorch user knows (issue 45, item 7).

Every case is a fresh process with its own ``TORCHINDUCTOR_CACHE_DIR`` at another path (the
same ``TORCHINDUCTOR_COMPILE_THREADS=1`` for all: no compile pool competing for this
2-core machine's CPU), on one local directory store:

- ``cold``: an empty directory and an empty store, under ``plancache run`` (a miss; the
  program compiles; its directory is pushed after it ends). Off the measured call, it also
  saves torch's mega-cache (``plancache.integrations.torch.save``);
- ``warm``: the cold directory again, without plancache (Inductor's own local cache);
- ``new machine, plancache run``: an empty directory, ``plancache run -- python
  torch_program.py`` (the pull installs the cold run's bundle first);
- ``new machine, hand copy``: a copy of the cold directory (``cp -a``, what ``aws s3 sync``
  twice gives), without plancache;
- ``new machine, mega-cache``: an empty directory; ``plancache.integrations.torch.load``
  of the cold run's bytes before compiling.

Per case: the first call's wall and CPU seconds (the program's own clock: where Inductor
compiles or finds its caches), the whole process's wall seconds (``plancache run``'s pull
and push included where it runs), torch's counters (``fxgraph_cache_hit`` and ``_miss``,
``autograd_cache_hit`` and ``_miss``) and whether the loss and every gradient equal the cold
run's bit for bit. ``--runs`` repeats the whole set (fresh directories and store each time);
the figures are the median and the range. Needs a Python with torch (the ``tox -e vllm``
environment, or ``PLANCACHE_BENCH_VLLM_PYTHON``); without one it says so and is skipped.

``python -m benchmarks.torch_run --runs 3 --json torch_run.json``; in the main job's
``--all`` (``python -m benchmarks --all``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.compile_share import vllm_python

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "benchmarks" / "torch_program.py"
MEGA = "torch-run-bench"
CASES = (
    "cold",
    "warm",
    "new machine, plancache run",
    "new machine, hand copy",
    "new machine, mega-cache",
)
HITS = {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 0, "autograd_cache_hit": 1}
"""What torch counts when the forward's and the backward's graphs both come from a cache."""


def _process(python: str, root: Path, store: Path, *args: str, run: bool = False) -> dict[str, Any]:
    """One fresh process of the program (under ``plancache run`` if ``run``): its report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANCACHE_", "TORCH"))}
    env.update(
        PYTHONPATH=str(REPO),
        PYTHONDONTWRITEBYTECODE="1",
        PLANCACHE_URL=str(store),
        TORCHINDUCTOR_CACHE_DIR=str(root),
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    command = [python, str(PROGRAM), *args]
    if run:
        command = [python, "-m", "plancache", "run", "--", *command]
    start = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"program failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    report["process_s"] = wall
    report["plancache"] = [line for line in out.stderr.splitlines() if line.startswith("plancache")]
    return report


def measure_once(python: str, work: Path) -> dict[str, dict[str, Any]]:
    """The five cases once (see the module docstring), in fresh directories."""
    store = work / "store"
    store.mkdir(parents=True)
    cold, copy = work / "cold", work / "copy"
    out: dict[str, dict[str, Any]] = {}
    print("  cold (compiles; pushed by plancache run; mega-cache saved) ...", flush=True)
    out["cold"] = _process(python, cold, store, "--mega-save", MEGA, run=True)
    shutil.copytree(cold, copy, symlinks=True)  # by hand, as published
    print("  warm (Inductor's own cache) ...", flush=True)
    out["warm"] = _process(python, cold, store)
    print("  new machine, plancache run ...", flush=True)
    out[CASES[2]] = _process(python, work / "new", store, run=True)
    print("  new machine, hand copy ...", flush=True)
    out[CASES[3]] = _process(python, copy, store)
    print("  new machine, mega-cache ...", flush=True)
    out[CASES[4]] = _process(python, work / "mega", store, "--mega-load", MEGA)
    for report in out.values():
        report["equal"] = (report["loss"], report["grads"]) == (
            out["cold"]["loss"],
            out["cold"]["grads"],
        )
        report["all_hits"] = all(report["counters"][k] == v for k, v in HITS.items())
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(work: Path, runs: int = 3) -> dict[str, Any]:
    """``runs`` sets of the five cases; per case the median and range of each figure."""
    python = vllm_python()
    if python is None:
        return {
            "skipped": "no Python with torch (build tox -e vllm or set PLANCACHE_BENCH_VLLM_PYTHON)"
        }
    sets = []
    for i in range(runs):
        print(f" run {i + 1} of {runs}", flush=True)
        sets.append(measure_once(python, work / f"run-{i}"))
    cases: dict[str, Any] = {}
    for case in CASES:
        reports = [s[case] for s in sets]
        cases[case] = {
            "first_call_s": _spread([r["first_call_s"] for r in reports]),
            "first_call_cpu_s": _spread([r["first_call_cpu_s"] for r in reports]),
            "process_s": _spread([r["process_s"] for r in reports]),
            "counters": [r["counters"] for r in reports],
            "all_hits": all(r["all_hits"] for r in reports),
            "equal": all(r["equal"] for r in reports),
            "plancache": reports[-1]["plancache"],
        }
        if case != "cold":
            ratios = [
                r["first_call_s"] / s["warm"]["first_call_s"]
                for r, s in zip(reports, sets, strict=True)
            ]
            cases[case]["first_call_x_warm"] = _spread(ratios)
    return {"python": python, "runs": runs, "cases": cases}


def table(result: dict[str, Any]) -> str:
    """The figures as a table: median (min-max) of each case."""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    rows = [
        f"{'case':30} {'first call s':>22} {'x warm':>18} {'CPU s':>8} {'process s':>10} hits equal"
    ]
    for case, c in result["cases"].items():

        def cell(s: dict[str, float]) -> str:
            return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

        x = cell(c["first_call_x_warm"]) if "first_call_x_warm" in c else "-"
        rows.append(
            f"{case:30} {cell(c['first_call_s']):>22} {x:>18} "
            f"{c['first_call_cpu_s']['median']:8.2f} {c['process_s']['median']:10.1f} "
            f"{'yes' if c['all_hits'] else 'no':4} {'yes' if c['equal'] else 'NO'}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torch_run", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plancache-torch-run-") as work:
        result = measure(Path(work), args.runs)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    cases = result.get("cases", {})
    return 0 if all(c["equal"] for c in cases.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
