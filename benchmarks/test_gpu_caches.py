"""The GPU cache benchmark's mechanics without a GPU: ``--device cpu`` with the tiny model
(five fresh processes, Inductor's C++ on CPU, about 60 s on a 2-core machine), the custom
Triton kernels compiled for a CUDA target and counted by the listener, the skip without
CUDA, and how failures are told. The first two need torch and Triton
(``.tox/vllm/bin/python -m pytest benchmarks/test_gpu_caches.py``); elsewhere they skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_caches import NEW_NODES, VARIANTS, failures, table

ROOT = Path(__file__).resolve().parent.parent
CPU_RUN_TIMEOUT_S = 600


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_caches", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_without_cuda_it_says_why_and_exits_0(tmp_path: Path) -> None:
    try:
        import torch
    except ImportError:
        pass
    else:
        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA GPU: the benchmark would run")
    out = tmp_path / "r.json"
    done = _run("--json", str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("skipped: no CUDA GPU (") and line.endswith(")"), line
    assert json.loads(out.read_text())["skipped"] == line


def test_cpu_mode_runs_the_five_nodes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out, work = tmp_path / "r.json", tmp_path / "work"
    done = _run(
        "--device", "cpu", "--json", str(out), "--work-dir", str(work), timeout=CPU_RUN_TIMEOUT_S
    )
    report = json.loads(out.read_text())
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:], report.get("failures"))
    assert report["failures"] == [] and "skipped" not in report
    assert report["custom_kernels"].startswith("skipped: the custom Triton kernels need a CUDA")
    (run,) = report["runs"]
    assert sorted(run) == sorted(VARIANTS)
    for variant, result in run.items():
        assert "error" not in result, (variant, result)
        assert result["outputs_equal"] is True and result["mismatched"] == [], variant
        assert 0 < result["first_forward_s"] < result["whole_s"], variant
        assert result["custom_kernels"].startswith("skipped: "), variant
    fx = {v: r["counters"]["inductor"] for v, r in run.items()}
    assert fx["cold"].get("fxgraph_cache_miss", 0) >= 1 and not fx["cold"].get("fxgraph_cache_hit")
    for variant in ("warm", "bundles"):
        assert fx[variant].get("fxgraph_cache_hit", 0) >= 1, (variant, fx[variant])
        assert not fx[variant].get("fxgraph_cache_miss"), (variant, fx[variant])
    assert run["cold"]["cpp_builds"] >= 1  # Inductor's C++ kernels, compiled once
    assert run["warm"]["cpp_builds"] == 0 and run["bundles"]["cpp_builds"] == 0
    cold = run["cold"]
    assert cold["push"]["inductor"]["files"] > 0 and cold["megacache_bytes"] > 0
    pulled = run["bundles"]["pull"]["inductor"]
    assert pulled["reason"] == "hit" and pulled["files"] == cold["push"]["inductor"]["files"]
    assert run["megacache"]["megacache_load_s"] >= 0
    roots = {v: Path(r["root"]) for v, r in run.items()}
    assert not roots["cold"].exists()  # removed before the new nodes ran
    assert len({roots[v] for v in ("cold", *NEW_NODES)}) == 4  # each at its own path
    assert all(v in report["table"] for v in VARIANTS)


def test_a_node_that_failed_or_differs_is_a_failure() -> None:
    good = {
        "whole_s": 2.0,
        "first_forward_s": 1.0,
        "outputs_equal": True,
        "counters": {"inductor": {"fxgraph_cache_hit": 1}},
    }
    run = {v: dict(good) for v in VARIANTS}
    assert failures([run]) == []
    run["copy"] = {**good, "outputs_equal": False, "mismatched": ["logits"]}
    run["megacache"] = {"variant": "megacache", "error": "exit 1"}
    del run["bundles"]
    assert failures([run]) == [
        "run 0: bundles did not run",
        "run 0: copy: outputs differ from cold's: ['logits']",
        "run 0: megacache: exit 1",
    ]
    rows = table([run]).splitlines()
    assert any(r.startswith("| copy |") and r.endswith("| DIFFER |") for r in rows)
    assert any(r.startswith("| megacache | failed |") for r in rows)


COMPILE_FOR_CUDA = """
import json, triton
from triton.backends.compiler import GPUTarget
from benchmarks import gpu_kernels as k
from benchmarks.gpu_caches import TritonCounts

counts = TritonCounts(k.NAMES)
counts.install()
p, c, block = "*bf16", "constexpr", {"BLOCK": 256}
kernels = [
    (k.bench_add, {"x_ptr": p, "y_ptr": p, "out_ptr": p, "n": "i32", "BLOCK": c}, block),
    (k.bench_silu_mul, {"g_ptr": p, "u_ptr": p, "out_ptr": p, "n": "i32", "BLOCK": c}, block),
    (k.bench_scale, {"x_ptr": p, "out_ptr": p, "n": "i32", "factor": "fp32", "BLOCK": c}, block),
    (
        k.bench_rms_norm,
        {"x_ptr": p, "w_ptr": p, "out_ptr": p, "cols": "i32", "eps": "fp32", "BLOCK": c},
        {"BLOCK": 64},
    ),
]
for fn, signature, constexprs in kernels:
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    triton.compile(source, target=GPUTarget("cuda", 90, 32))
print(json.dumps({"compiled": counts.compiled, "cached": counts.cached}))
"""


def test_the_custom_kernels_compile_for_cuda_and_the_listener_counts_them(tmp_path: Path) -> None:
    """Triton compiles for an sm_90 target without a GPU: each custom kernel compiles, is
    counted as custom and compiled, then, in a second process on the same cache, as a hit."""
    pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    if not hasattr(getattr(triton, "knobs", None), "compilation"):
        pytest.skip(f"Triton {triton.__version__} has no compilation listener")
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    env["TRITON_HOME"] = str(tmp_path / "home")
    seen = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_FOR_CUDA],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
    none = {"inductor": 0, "custom": 0}
    assert seen[0] == {"compiled": {"inductor": 0, "custom": 4}, "cached": none}
    assert seen[1] == {"compiled": none, "cached": {"inductor": 0, "custom": 4}}
