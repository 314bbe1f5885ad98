"""The main job as a user meets it: one line per stage, worker and library output in the
log file, one headline table at the end, a meaningful exit status, and a plot that leads
with what plancache saves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parent.parent


def fleet_only(nodes: int) -> list[str]:
    """The smallest run: the fleet on a local directory, ``nodes`` processes, one seed."""
    return [
        *("--fleet-only", "--no-remote", "--nodes", str(nodes), "--configs", "1"),
        *("--seeds", "1", "--profile-seconds", "0.01", "--arrival-window", "0.05"),
    ]


def main_job(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks`` in a fresh process, its results under ``out``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_worker_warnings_go_to_the_log_and_the_run_ends_with_the_headline(
    tmp_path: Path,
) -> None:
    # a lookup budget of 1 µs: the fleet's worker processes log timeouts (WARNING)
    run = main_job(tmp_path, *fleet_only(2), "--fleet-timeout", "0.000001")
    assert run.returncode == 0, run.stdout + run.stderr
    log = (tmp_path / "bench.log").read_text()
    assert re.search(r"SpawnPoolWorker-\d+ WARNING plancache: (lookup|record) timeout", log)
    assert run.stderr == ""
    assert "WARNING" not in run.stdout and "timeout fp=" not in run.stdout
    lines = run.stdout.splitlines()
    progress = lines[: lines.index("") - 1]
    assert len(progress) == 13, progress  # one line per stage, the plot's included
    for line in progress:
        assert re.search(r" \.\.\. [\d.]+ s$|: skipped: .+$", line), line
    assert re.match(r"13 stages in [\d.]+ s: \d+ ran, \d+ skipped, 0 failed", lines[len(progress)])
    assert str(tmp_path / "bench.log") in lines[len(progress)]
    table = run.stdout.split("headline results: ", 1)[1]
    assert table.index("WHAT IT SAVES AT BOOT") < table.index("NOT MEASURED HERE")
    assert re.search(r"KV profiling: fleet on local directory +\d+/8 boots skipped", table)
    assert re.search(r"real GPU boots +skipped: ", table)
    assert re.search(r"rollout simulation +skipped: --no-remote", table)
    assert re.search(rf"log of workers and libraries +{tmp_path / 'bench.log'}$", table)
    figures = json.loads((tmp_path / "results.json").read_text())
    assert figures["fleet"]["setups"]["shared"]["reasons"]["timeout"] > 0  # nothing dropped
    assert figures["stages"]["fleet"]["status"] == "measured"
    assert "fleet (SIMULATED profiling" in (tmp_path / "tables.txt").read_text()


def test_a_failed_stage_is_shown_the_others_still_saved_and_the_exit_status_is_1(
    tmp_path: Path,
) -> None:
    run = main_job(tmp_path, *fleet_only(0))  # a pool of 0 processes raises
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"fleet simulation: 0 processes.* \.\.\. FAILED after [\d.]+ s \(", run.stdout)
    assert "FAILED (traceback in the log)" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert "stage failed: fleet simulation" in (tmp_path / "bench.log").read_text()
    figures = json.loads((tmp_path / "results.json").read_text())
    assert figures["failed"].keys() == {"fleet"} and "fleet_sweep" in figures


def fake_results() -> dict[str, Any]:
    """A run on a machine without a GPU: compile boots measured, the local store measured,
    S3 and GCS skipped."""
    p = {"n": 10, "p50_us": 200.0, "p99_us": 400.0}
    case = {"first_forward_s": 3.6, "process_s": 30.0, "fetch_s": 0.2, "plancache": "hit"}
    case |= {"first_forward_saved_s": 21.6, "first_forward_ratio": 0.14, "process_saved_s": 17.0}
    cold = case | {"first_forward_s": 25.2, "first_forward_saved_s": 0.0, "plancache": "miss"}
    warm = case | {"process_s": 25.0, "first_forward_s": 3.0}
    return {
        "machine": {"cpu": "cpu", "cpu_count": 2, "memory_gib": 24.0, "gpus": []},
        "stores": {
            "local": {
                "baseline_vllm_load_plan": p | {"p50_us": 50.0},
                "baseline_open_json_load": p | {"p50_us": 30.0},
                "get_hit": p | {"p50_us": 45.0},
                "lookup_hit": p,
            }
        },
        "compile": {
            "cases": {
                "cold": cold | {"first_forward_ratio": 1.0, "process_s": 47.0},
                "warm": warm,
                "new node, S3": case,
            }
        },
        "boot": "skipped: no CUDA GPU on this machine (nvidia-smi lists none)",
        "stages": {"remote": {"what": "S3 and GCS", "status": "skipped: --no-remote"}},
    }


def test_the_headline_leads_with_savings_and_says_what_was_not_measured() -> None:
    table = report.headline(fake_results())
    saves, costs, missing = (
        table.index(h) for h in ("WHAT IT SAVES", "WHAT IT COSTS", "NOT MEASURED HERE")
    )
    assert saves < costs < missing
    assert re.search(
        r"whole boot: new node, store: S3 +process 30.0 s \(1.20x warm, 47.0 s cold\): 17.0 s "
        r"saved; first forward 3.6 s vs 25.2 s cold \(0.14x",
        table,
    )
    assert re.search(r"lookup hit, local +200 µs p50, 400 µs p99: 4x vLLM's built-in", table)
    assert re.search(r"vLLM's built-in read \(_load_plan\) +50 µs p50; its open \+ json", table)
    assert re.search(r"get hit \(every rule checked\) +45 µs p50: 0.9x vLLM's read, 1.5x", table)
    assert re.search(r"S3 and GCS +skipped: --no-remote", table[missing:])
    assert re.search(r"real GPU boots +skipped: no CUDA GPU", table[missing:])


def test_the_plot_leads_with_savings_and_says_what_was_not_measured() -> None:
    pytest.importorskip("matplotlib")
    fig = report.figure(fake_results())
    lead, costs = fig.axes[0], fig.axes[-1]
    assert "SAVES" in lead.get_title() and "COSTS" in costs.get_title()
    words = [t.get_text() for t in lead.texts]
    assert any("17.0 s saved" in w for w in words), words
    assert any(w.startswith("not measured here: skipped: no CUDA GPU") for w in words), words
    assert not any(re.search(r"\d+\.\dx built-in", w) for w in words)
    ticks = [t.get_text() for t in costs.get_yticklabels()]
    assert "local  lookup_hit  (4x built-in)" in ticks, ticks
