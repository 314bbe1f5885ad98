"""The perturbation matrix: a producer node compiles vLLM 0.33.0's real ``support_torch_compile``
path on CPU and stores its artifact; each consumer differs from it in exactly one thing and
boots on the same store (a fresh process, its own ``VLLM_CACHE_ROOT``). Every row's outcome is
written down before the run, from what vLLM keys (``aot_compile_hash_factors``: its compile
env factors, ``VllmConfig.compute_hash()``, Inductor's factors, the forward) and what
plancache keys; the run must match it. A hit must give the producer's output bit for bit
(the sha256 of the first forward's output), and a miss must be named: the log line names
the factors in which the nearest stored artifact's key differs.

By default (``tox -e vllm``, so CI) three rows run; ``tox -e matrix`` runs every row and
writes the table to ``PLANCACHE_MATRIX_OUT`` (docs/compile.md holds the last one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from plancache.testing import child_env
from tests.vllm import support
from tests.vllm.support import HERE, MODEL_CONFIG, REPO, vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
    pytest.mark.timeout(1800),
]
NODE = HERE / "compile_node.py"
NODE_TIMEOUT_S = 600.0
BATCH = 3
"""Consumers started side by side (most of a node's time is imports and waits)."""
FULL = os.environ.get("PLANCACHE_MATRIX") == "full"
WAIT = ("--wait-upload", "120")
"""The producer waits for its upload before it exits."""
MISS_LINE = re.compile(r"compile artifact \S+: miss: (.*)")


@dataclass(frozen=True)
class Row:
    """One consumer: what differs from the producer, and the outcome expected before the run
    (``hit``, ``miss``, or ``not run`` with ``why``); a miss names every factor of
    ``named``."""

    name: str
    group: str
    expected: str
    named: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    moved_model: bool = False
    cwd: bool = False
    host: str | None = None
    why: str = ""


PATHS, SAME, DIFFERENT, SOFTWARE, NAMES = (
    "path moves",
    "settings that do not change the computation",
    "settings that do",
    "software and hardware",
    "names at the limits",
)
ROWS = [
    Row("VLLM_CACHE_ROOT", PATHS, "hit", why="every consumer has its own; this row only that"),
    Row(
        "HOME and XDG_CACHE_HOME",
        PATHS,
        "hit",
        env={"HOME": "{tmp}/home", "XDG_CACHE_HOME": "{tmp}/xdg"},
    ),
    Row("TRITON_CACHE_DIR", PATHS, "hit", env={"TRITON_CACHE_DIR": "{tmp}/triton"}),
    Row("TORCHINDUCTOR_CACHE_DIR", PATHS, "hit", env={"TORCHINDUCTOR_CACHE_DIR": "{tmp}/ind"}),
    Row(
        "the model directory",
        PATHS,
        "miss",
        ("config.model", "config_hash"),
        moved_model=True,
        why="vLLM's ModelConfig.compute_hash keys the model's path",
    ),
    Row("the working directory", PATHS, "hit", cwd=True),
    Row("the host name", PATHS, "hit", host="matrix-other-host"),
    Row("an unrelated variable", SAME, "hit", env={"MATRIX_UNRELATED": "1"}),
    Row("VLLM_LOGGING_LEVEL", SAME, "hit", env={"VLLM_LOGGING_LEVEL": "DEBUG"}),
    Row("another port", SAME, "hit", env={"VLLM_PORT": "23456"}),
    Row("the seed", SAME, "hit", engine={"seed": 7}, why="ModelConfig.compute_hash ignores it"),
    Row(
        "gpu_memory_utilization",
        SAME,
        "hit",
        engine={"gpu_memory_utilization": 0.5},
        why="compile key: CacheConfig.compute_hash ignores it; the plan key holds it "
        "(`plancache explain` names it: tests/cli)",
    ),
    Row("dtype", DIFFERENT, "miss", ("config.dtype",), engine={"dtype": "float16"}),
    Row(
        "max_model_len", DIFFERENT, "miss", ("config.max_model_len",), engine={"max_model_len": 256}
    ),
    Row(
        "a compile-relevant VLLM_* variable",
        DIFFERENT,
        "miss",
        ("env.VLLM_BATCH_INVARIANT",),
        env={"VLLM_BATCH_INVARIANT": "1"},
    ),
    Row(
        "another model revision",
        DIFFERENT,
        "miss",
        ("config.revision",),
        engine={"revision": "matrix-v2"},
    ),
    Row(
        "vLLM 0.32 vs 0.33",
        SOFTWARE,
        "not run",
        ("vllm", "forward_hash"),
        why="expected miss (vLLM's version is in the key); one vLLM per environment: "
        "`tox -e vllm-versions` installs each wheel in turn (about 12 min)",
    ),
    Row(
        "another Triton version",
        SOFTWARE,
        "not run",
        ("inductor_hash",),
        why="expected miss (Inductor's system factors); one Triton per environment",
    ),
    Row(
        "another device or compute capability",
        SOFTWARE,
        "not run",
        ("inductor_hash",),
        why="expected miss (Inductor's system factors name the device); a CPU has none to "
        "fake; the plan key's device facts: tests/vllm/test_factors.py",
    ),
    Row(
        "file names of 129-255 bytes, deep trees, Triton's characters",
        NAMES,
        "not run",
        why="expected: they travel; tests/artifacts/test_archive.py (Triton's layout)",
    ),
]
CI_ROWS = (
    "HOME and XDG_CACHE_HOME",
    "gpu_memory_utilization",
    "a compile-relevant VLLM_* variable",
)
SELECTED = [r for r in ROWS if r.expected != "not run" and (FULL or r.name in CI_ROWS)]


@dataclass
class Run:
    row: Row
    report: dict[str, Any]
    log: str
    outcome: str = ""
    named: str = ""


def _start(
    row: Row, model_dir: Path, store: Path, tmp: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    env = {k: v.replace("{tmp}", str(tmp)) for k, v in row.env.items()}
    for name in ("HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        if name in env:
            Path(env[name]).mkdir(parents=True, exist_ok=True)
    if row.moved_model:
        moved = tmp / "moved-model"
        shutil.copytree(model_dir, moved)
        model_dir = moved
    child = child_env(
        [REPO],
        PLANCACHE_URL=str(store),
        VLLM_CACHE_ROOT=str(tmp / "vllm"),
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        **env,
    )
    command = [sys.executable, str(NODE), "--model-dir", str(model_dir), *extra]
    command += [f"--engine-arg={k}={json.dumps(v)}" for k, v in row.engine.items()]
    if row.host is not None:  # a UTS namespace of its own (root, as on this machine)
        command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', row.host, *command]
    cwd = tmp / "elsewhere" if row.cwd else REPO
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        command, env=child, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _reports(*procs: subprocess.Popen[str]) -> Iterator[tuple[dict[str, Any], str]]:
    for returncode, report, log in support.outcomes(*procs, timeout=NODE_TIMEOUT_S):
        assert returncode == 0, log[-4000:]
        yield report, log


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The producer, then every selected row's consumer, ``BATCH`` at a time."""
    base = tmp_path_factory.mktemp("matrix")
    model_dir, store = base / "model", base / "store"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    produce = _start(Row("producer", "", "miss"), model_dir, store, base / "producer", WAIT)
    ((made, made_log),) = _reports(produce)
    assert made["aot_saved"] == 1 and "stored: store=created" in made_log, made_log[-3000:]
    out: dict[str, Run] = {"producer": Run(Row("producer", "", "miss"), made, made_log)}
    for i in range(0, len(SELECTED), BATCH):
        batch = SELECTED[i : i + BATCH]
        procs = [_start(r, model_dir, store, base / f"row{i + n}") for n, r in enumerate(batch)]
        for row, (report, log) in zip(batch, _reports(*procs), strict=True):
            run = Run(row, report, log)
            loaded = report["loaded_from_disk"] and report["aot_compiles"] == 0
            run.outcome = "hit" if loaded else "miss" if report["aot_compiles"] == 1 else "?"
            named = MISS_LINE.search(log)
            run.named = named.group(1) if named else ""
            out[row.name] = run
    _write_table(out, base)
    return out


@pytest.mark.parametrize("row", SELECTED, ids=[r.name for r in SELECTED])
def test_each_row_ends_as_expected_hits_match_the_output_and_misses_are_named(
    row: Row, runs: dict[str, Run]
) -> None:
    run, produced = runs[row.name], runs["producer"].report
    assert run.outcome == row.expected, run.log[-3000:]
    if row.expected == "hit":
        assert run.report["output"] == produced["output"], "a hit with another output"
        assert "compile artifact" in run.log and ": hit" in run.log
    else:
        assert run.named, run.log[-3000:]  # a miss without a reason fails the row
        for factor in row.named:
            assert f"{factor}:" in run.named, run.named
        assert run.report["output"] == produced["output"]  # compiled again: same code


def _write_table(runs: dict[str, Run], base: Path) -> None:
    """Every row (selected or not) as a Markdown table, to ``PLANCACHE_MATRIX_OUT`` (the
    run's temporary directory ``base`` written as ``$TMP``)."""
    target = os.environ.get("PLANCACHE_MATRIX_OUT")
    if not target:
        return
    produced = runs["producer"].report["output"]
    lines = [
        "| group | differs in | expected | actual | reason named | output |",
        "|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        run = runs.get(row.name)
        if run is None:
            lines.append(f"| {row.group} | {row.name} | {row.expected} | not run | {row.why} | - |")
            continue
        output = "equal" if run.report["output"] == produced else "DIFFERENT"
        named = run.named.replace(str(base), "$TMP").replace("|", "\\|")[:300]
        reason = named if run.outcome == "miss" else row.why or "-"
        lines.append(
            f"| {row.group} | {row.name} | {row.expected} | {run.outcome} | {reason} | {output} |"
        )
    Path(target).write_text("\n".join(lines) + "\n")
