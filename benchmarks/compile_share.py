"""Boot time saved by shared compile artifacts: real vLLM 0.33 compiles on this machine's CPU,
each node a fresh process (``tests/vllm/compile_node.py``: a tiny ``support_torch_compile``
model, real ``VllmConfig``, real AOT compile, save and load, a warm-up of one more size;
no simulation).

Cases, each with its whole-process time, its first-forward time (where vLLM compiles or
loads) and its phases:

- ``cold``: empty ``VLLM_CACHE_ROOT``, empty store: vLLM compiles; plancache uploads.
- ``warm``: the same node again: vLLM's own local cache; what its first load and warm-up
  added to ``inductor_cache/`` is uploaded (a delta).
- ``new node, local dir``: empty ``VLLM_CACHE_ROOT``; the artifact, its additions and the
  model info the nodes shared, from a shared directory.
- ``new node, S3``: empty ``VLLM_CACHE_ROOT``; the same from S3 (moto on 127.0.0.1).

After the cold node, ``PAIRS`` rounds of three boots back to back (a warm node, a new node
from the directory, a new node from S3; the order turns by one each round, so that no case
always comes first or last): each new node is compared with the warm node of its round,
booted beside it, so that what the machine does meanwhile falls on both. A new node's
``process_x_warm`` is the median of its store's pair ratios (``process_x_warm_runs``, in
round order); each case's other figures are its median boot's (``process_runs_s``: every
boot's whole process, in round order).

The real ``Worker`` path to ready (``tests/vllm/real_worker.py``: vLLM 0.33's own ``Worker``
and engine config, the GPU's memory counters and the model runner faked): a cold node (it
profiles, vLLM inspects the model class), the same node again, and a new node fed the plan
and the model info through a shared directory; process start to ``compile_or_warm_up_model``
returned.

Triton's cache (``tests/vllm/triton_node.py``, where the vLLM Python has Triton): real
kernels compiled for a CUDA target on a cold node, the same node again, and a new node fed
the shared cache; how many kernels each compiled.

With ``costs`` (``python -m benchmarks --all``): what a hit adds to the critical path (fetch,
verify and install of the real artifact) on a local directory, S3 and GCS, with 0 and 300 ms
injected per request; what a miss costs per kind; and the peak memory of storing and
fetching an artifact of ``--compile-memory-mib``. Needs a Python with vLLM (the ``tox -e vllm``
environment, or ``PLANCACHE_BENCH_VLLM_PYTHON``); without one it says so and is skipped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from plancache import _events as events
from plancache import open_store
from plancache._artifacts.compiled import METRIC
from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings
from plancache.testing import servers
from tests.vllm.support import MODEL_CONFIG

REPO = Path(__file__).resolve().parent.parent
NODE = REPO / "tests" / "vllm" / "compile_node.py"
TRITON_NODE = REPO / "tests" / "vllm" / "triton_node.py"
WORKER = REPO / "tests" / "vllm" / "real_worker.py"
SIZES = ("--sizes", "16")
"""The warm-up: one compile size past the first forward's dynamic shape."""
PAIRS = 3
"""Rounds of a warm node and a new node per store (see the module): a boot here varies by a
second or two with what else the machine does, so one pair says little."""
LOCAL, S3 = "new node, local dir", "new node, S3"
AOT = Path("torch_compile_cache") / "torch_aot_compile"


def last_fetch(log: str) -> dict[str, Any] | None:
    """The last compile artifact's fetch a node's events (``PLANCACHE_EVENTS=1``) tell of:
    its ``reason`` and ``seconds``; None where it fetched none."""
    found = [
        e for e in events.read(log) if e.get("event") == "decision" and e.get("kind") == METRIC
    ]
    return found[-1] if found else None


def vllm_python() -> str | None:
    """A Python that imports vLLM: ``PLANCACHE_BENCH_VLLM_PYTHON``, else the ``tox -e vllm``
    environment of this checkout."""
    candidates = [os.environ.get("PLANCACHE_BENCH_VLLM_PYTHON", ""), REPO / ".tox/vllm/bin/python"]
    for python in map(str, candidates):
        if python and os.path.exists(python):
            found = subprocess.run(
                [
                    python,
                    "-c",
                    "import importlib.util as u; print(u.find_spec('vllm') is not None)",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if found.stdout.strip() == "True":
                return python
    return None


def _node(
    python: str, model_dir: Path | None, root: Path, url: str, *args: str, **env: str
) -> dict[str, Any]:
    """One fresh process: a compile node (``model_dir``), else the script ``args[0]``
    names with the rest of ``args``."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("PLANCACHE_")}
    child.update(
        PYTHONPATH=str(REPO),
        PLANCACHE_URL=url,
        PLANCACHE_EVENTS="1",
        VLLM_CACHE_ROOT=str(root),
        TRITON_CACHE_DIR=str(root / "triton"),
        TRITON_DEFAULT_FP_FUSION="1",
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        **env,
    )
    start = time.perf_counter()
    node = [str(NODE), "--model-dir", str(model_dir)] if model_dir else []
    out = subprocess.run(
        [python, *node, *args],
        env=child,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - start
    report: dict[str, Any] | None = None
    for line in reversed(out.stdout.splitlines()):  # vLLM's log lines share stdout with it
        with contextlib.suppress(ValueError):
            report = json.loads(line) if line.startswith("{") else None
        if isinstance(report, dict):
            break
    if out.returncode != 0 or not isinstance(report, dict):
        raise RuntimeError(
            f"node failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        )
    report["wall_s"] = wall
    fetch = last_fetch(out.stdout + out.stderr)
    report["plancache"] = fetch["reason"] if fetch else "-"
    report["fetch_s"] = float(fetch["seconds"]) if fetch else None
    return report


def measure_boots(work: Path) -> dict[str, Any]:
    """The four cases (see the module docstring), in fresh processes."""
    python = vllm_python()
    if python is None:
        return {
            "skipped": "no Python with vLLM (build tox -e vllm or set PLANCACHE_BENCH_VLLM_PYTHON)"
        }
    model_dir = work / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    store = str(work / "store")
    wait = ("--wait-upload", "120")
    print("  cold node (compiles) ...", flush=True)
    cold = _node(python, model_dir, work / "cold", store, *wait, *SIZES)
    boots: dict[str, list[dict[str, Any]]] = {"warm": [], LOCAL: [], S3: []}
    with servers.s3_server() as (url, options):
        s3_env = {"PLANCACHE_STORAGE_OPTIONS": json.dumps(options)}
        nodes = {
            "warm": lambda i: _node(python, model_dir, work / "cold", store, *wait, *SIZES),
            LOCAL: lambda i: _node(python, model_dir, work / f"new-local-{i}", store, *SIZES),
            S3: lambda i: _node(
                python,
                model_dir,
                work / f"new-s3-{i}",
                url,
                *SIZES,
                **s3_env,
                PLANCACHE_COMPILE_TRUST_UNSIGNED="1",
            ),
        }
        for i in range(PAIRS):
            order = list(nodes)[i % 3 :] + list(nodes)[: i % 3]
            for case in order:
                if case == S3 and not boots[S3]:  # what the boots before it shared, copied
                    _copy_shared(open_store(store), open_store(url, **options))
                print(f"  round {i + 1} of {PAIRS}: {case} ...", flush=True)
                boots[case].append(nodes[case](i))
    cases = {"cold": cold, **{case: _median(runs) for case, runs in boots.items()}}
    for report in cases.values():
        report["first_forward_saved_s"] = cold["first_forward_s"] - report["first_forward_s"]
        report["first_forward_ratio"] = report["first_forward_s"] / cold["first_forward_s"]
        report["process_saved_s"] = cold["process_s"] - report["process_s"]
        report["process_x_warm"] = report["process_s"] / cases["warm"]["process_s"]
    for new_node in (LOCAL, S3):
        ratios = [
            new["process_s"] / warm["process_s"]
            for new, warm in zip(boots[new_node], boots["warm"], strict=True)
        ]
        cases[new_node]["process_x_warm_runs"] = ratios
        cases[new_node]["process_x_warm"] = statistics.median(ratios)
    key = next((work / "cold" / AOT).iterdir())
    return {"python": python, "cases": cases, "artifact_dir": str(key), "pairs": PAIRS}


def _copy_shared(local: Any, remote: Any) -> None:
    """Copy every shared object (compile artifacts, caches, model info) from ``local`` to
    ``remote``."""
    for prefix in ("compile_artifact_", "cache_", "model_info_"):
        for name in local.layer.list_objects(prefix):
            opened = local.layer.open_object(name)
            assert opened is not None
            with contextlib.closing(opened):
                chunks = iter(functools.partial(opened.read, 1 << 20), b"")
                assert remote.layer.write_object(name, chunks)


def _median(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The report of the median whole process among ``reports`` (each a fresh process),
    with every boot's ``process_runs_s`` in the order given."""
    median = dict(sorted(reports, key=lambda r: r["process_s"])[len(reports) // 2])
    median["process_runs_s"] = [r["process_s"] for r in reports]
    return median


def measure_triton(python: str, work: Path) -> dict[str, Any]:
    """Triton's cache: cold node, the same node again, a new node fed the shared cache
    (fresh processes, real kernels compiled for a CUDA target); kernels each compiled."""
    found = subprocess.run(
        [python, "-c", "import triton"], capture_output=True, text=True, timeout=120
    )
    if found.returncode != 0:
        return {"skipped": "Triton is not installed beside vLLM"}
    store = str(work / "triton-store")
    out: dict[str, Any] = {}
    for name, root in (("cold", "t-cold"), ("warm", "t-cold"), ("new node", "t-new")):
        print(f"  Triton, {name} ...", flush=True)
        out[name] = _node(python, None, work / root, store, str(TRITON_NODE))
    return out


def measure_worker(python: str, work: Path, model_dir: Path) -> dict[str, Any]:
    """The real ``Worker`` path to ready: cold, warm, new node (see the module docstring)."""
    store = str(work / "worker-store")
    out: dict[str, Any] = {}
    for name, root in (("cold", "w-cold"), ("warm", "w-cold"), ("new node", "w-new")):
        print(f"  real Worker to ready, {name} ...", flush=True)
        report = _node(
            python,
            None,
            work / root,
            store,
            str(WORKER),
            "--model-dir",
            str(model_dir),
            GLOO_SOCKET_IFNAME="lo",
        )
        out[name] = {
            "ready_s": report["times"]["ready"],
            "engine_config_s": report["times"]["engine_config"],
            "mode": report["mode"],
        }
    return out


def measure_fetch(artifact: Path, work: Path, runs: int = 5) -> dict[str, Any]:
    """Critical-path cost of a hit: fetch, verify and install ``artifact`` (vLLM's ``<key>``
    directory) into an empty directory, per store and injected latency (median of
    ``runs``)."""
    out: dict[str, Any] = {}
    key = artifact.name
    for delay in (0.0, 0.3):
        with contextlib.ExitStack() as stack:
            specs: dict[str, Any] = {
                "s3": stack.enter_context(
                    servers.with_latency(stack.enter_context(servers.s3_server()), delay)
                ),
                "gcs": stack.enter_context(
                    servers.with_latency(stack.enter_context(servers.gcs_server()), delay)
                ),
            }
            if not delay:  # a local directory takes no requests to delay
                specs["local"] = (str(work / "fetch-store"), {})
            for name, (url, options) in specs.items():
                artifacts = ArtifactStore(
                    Settings(url, storage_options=options), CompileSettings(trust_unsigned=True)
                )
                artifacts.upload(artifact, key, "rank_0_0")
                seconds = []
                for i in range(runs):
                    target = work / f"fetch-{name}-{delay}-{i}" / key
                    fetched = artifacts.fetch(target, key, "rank_0_0")
                    assert fetched.reason == "hit", fetched
                    seconds.append(fetched.seconds)
                out[f"{name} +{int(delay * 1000)} ms"] = statistics.median(seconds)
    return out


def measure_miss(work: Path, runs: int = 3) -> dict[str, Any]:
    """What a miss costs per kind on an empty store (median of ``runs``, in seconds), per
    store and injected latency: model info (on the engine config's path), the artifact and
    its additions (the prefetch, while the model loads; the first forward joins it) and
    Triton's cache (in the background, joined by nothing)."""
    out: dict[str, Any] = {}
    key, scope = "0" * 64, "1" * 64
    for delay in (0.0, 0.3):
        with contextlib.ExitStack() as stack:
            specs: dict[str, Any] = {
                "s3": stack.enter_context(
                    servers.with_latency(stack.enter_context(servers.s3_server()), delay)
                ),
            }
            if not delay:
                specs["local"] = (str(work / "miss-store"), {})
            for name, (url, options) in specs.items():
                artifacts = ArtifactStore(
                    Settings(url, storage_options=options), CompileSettings(trust_unsigned=True)
                )
                kinds: dict[str, list[float]] = {}
                for i in range(runs):
                    root = work / f"miss-{name}-{delay}-{i}"
                    info = artifacts.fetch_model_info(
                        "model_info_" + key + ".json", key, root / "m"
                    )
                    kinds.setdefault("model info", []).append(info.seconds)
                    artifact = artifacts.fetch(root / key, key, "rank_0_0")
                    additions = artifacts.fetch_cache("inductor", key, root / key / "inductor")
                    kinds.setdefault("artifact + additions", []).append(
                        artifact.seconds + additions.seconds
                    )
                    triton = artifacts.fetch_cache("triton", scope, root / "triton")
                    kinds.setdefault("triton", []).append(triton.seconds)
                    assert {info.reason, artifact.reason, additions.reason} == {"miss"}
                out[f"{name} +{int(delay * 1000)} ms"] = {
                    k: statistics.median(v) for k, v in kinds.items()
                }
                artifacts.close()
    return out


def measure_memory(work: Path, size_mib: int) -> dict[str, Any]:
    """Peak RSS of a process that stores and fetches a ``size_mib`` artifact, on a local
    directory and on S3 (moto runs in this process, so its memory is not counted)."""
    from benchmarks.artifact_memory import make_tree

    out: dict[str, Any] = {}
    make_tree(work / "mem", size_mib)
    with servers.s3_server() as (url, options):
        for name, (u, o) in {"local": (str(work / "mem-store"), {}), "s3": (url, options)}.items():
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.artifact_memory",
                    u,
                    json.dumps(o),
                    str(work / "mem"),
                ],
                cwd=REPO,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
                capture_output=True,
                text=True,
                timeout=1200,
            )
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            shutil.rmtree(work / "mem" / "node", ignore_errors=True)
    for done in ("mem", "mem-store"):
        shutil.rmtree(work / done, ignore_errors=True)
    return out


def measure(work: Path, memory_mib: int, costs: bool = True) -> dict[str, Any]:
    """Every figure of the module docstring (``costs``: also a hit's and a miss's cost per
    store and the memory check)."""
    results = measure_boots(work)
    if "python" in results:
        results["worker"] = measure_worker(results["python"], work, work / "model")
        results["triton"] = measure_triton(results["python"], work)
    artifact = results.get("artifact_dir")
    if not costs:
        return results
    if artifact:
        print("  a hit's critical-path cost, local / S3 / GCS, 0 and 300 ms ...", flush=True)
        results["fetch"] = measure_fetch(Path(artifact), work)
        print("  a miss's cost per kind, local / S3, 0 and 300 ms ...", flush=True)
        results["miss"] = measure_miss(work)
    print(f"  peak memory with a {memory_mib} MiB artifact ...", flush=True)
    results["memory"] = measure_memory(work, memory_mib)
    return results


def table(results: dict[str, Any]) -> str:
    """The boot table (first thing a reader sees), the fetch costs and the memory."""
    lines = [
        "whole boot, cold vs warm vs new node: real vLLM 0.33 compiles on this CPU (tiny model, "
        "fresh processes, no simulation)",
        f"  {'case':22s} {'process':>9s} {'x warm':>7s} {'first forward':>13s} {'x cold':>7s} "
        f"{'inductor files':>14s}  plancache",
    ]
    if "skipped" in results:
        lines[1:] = [f"  boots skipped: {results['skipped']}"]
    for name, c in results.get("cases", {}).items():
        fetched = "" if c["fetch_s"] is None else f" in {c['fetch_s']:.3f} s"
        lines.append(
            f"  {name:22s} {c['process_s']:7.1f} s {c['process_x_warm']:6.2f}x "
            f"{c['first_forward_s']:11.2f} s {c['first_forward_ratio']:6.2f}x "
            f"{c['inductor_files']:14d}  {c['plancache']}{fetched}"
        )
    phases = {n: c["phases_s"] for n, c in results.get("cases", {}).items() if "phases_s" in c}
    if phases:
        lines.append("  the process by phase (s):")
        for phase in next(iter(phases.values())):
            lines.append(
                f"    {phase:52s} "
                + "  ".join(f"{n} {p.get(phase, float('nan')):.1f}" for n, p in phases.items())
            )
    runs = {
        n: c["process_runs_s"] for n, c in results.get("cases", {}).items() if "process_runs_s" in c
    }
    if runs:
        lines.append(
            f"  {results.get('pairs', '?')} rounds of a warm node and a new node per store, back "
            "to back; each case above is its median boot; every boot's process, in round "
            "order: "
            + "; ".join(
                f"{n} " + " / ".join(f"{r:.1f}" for r in rs) + " s" for n, rs in runs.items()
            )
        )
    for name, c in results.get("cases", {}).items():
        if "process_x_warm_runs" in c:
            ratios = c["process_x_warm_runs"]
            lines.append(
                f"  {name} / the warm node of its round: median {c['process_x_warm']:.2f}x, "
                f"{min(ratios):.2f}-{max(ratios):.2f}x ("
                + ", ".join(f"{r:.2f}x" for r in ratios)
                + ")"
            )
    worker = results.get("worker", {})
    if worker:
        lines.append(
            "  the real Worker path to ready (vLLM's Worker and engine config; GPU counters and "
            "model runner faked): "
            + ", ".join(
                f"{n} {w['ready_s']:.1f} s ({w['mode']}, config {w['engine_config_s']:.1f} s)"
                for n, w in worker.items()
            )
        )
    triton = results.get("triton", {})
    if "skipped" in triton:
        lines.append(f"  Triton's cache skipped: {triton['skipped']}")
    elif triton:
        lines.append(
            "  Triton's cache (real kernels for sm_90, compiled on this CPU): "
            + ", ".join(
                f"{n} compiled {t['compiled']} of {t['kernels']} in {t['compile_s']:.1f} s"
                for n, t in triton.items()
            )
        )
    fetch = results.get("fetch")
    if fetch:
        lines.append(
            "  a hit's fetch + verify + install (median): "
            + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in fetch.items())
        )
    for where, kinds in results.get("miss", {}).items():
        lines.append(
            f"  a miss on an empty store, {where}: "
            + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in kinds.items())
        )
    for name, m in results.get("memory", {}).items():
        lines.append(
            f"  {m['size_mib']} MiB artifact via {name}: peak RSS "
            f"{m['peak_rss_before_mib']:.0f} -> {m['peak_rss_after_mib']:.0f} MiB "
            f"(upload {m['upload_s']:.1f} s, fetch+install {m['fetch_install_s']:.1f} s)"
        )
    return "\n".join(lines)


def plot_boots(ax: Any, results: dict[str, Any]) -> None:
    """Whole-process and first-forward seconds per case, on matplotlib axes ``ax``."""
    names = list(results["cases"])
    first = [results["cases"][n]["first_forward_s"] for n in names]
    process = [results["cases"][n]["process_s"] for n in names]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], process, 0.4, label="whole process (x warm: median pair)")
    ax.bar([x + 0.2 for x in xs], first, 0.4, label="first forward (compile or load)", alpha=0.6)
    for x, n in zip(xs, names, strict=True):
        case = results["cases"][n]
        label = f"{case['process_x_warm']:.2f}x"
        if "process_x_warm_runs" in case:  # the median pair's, and the pairs' spread
            runs = case["process_x_warm_runs"]
            label += f"\n({min(runs):.2f}-{max(runs):.2f})"
        ax.text(x - 0.2, process[x], label, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [n.replace(", ", "\n") for n in names], fontsize=8)
    ax.set_ylabel("seconds (this machine's CPU)")
    ax.set_title("vLLM compile: cold vs warm vs new node\n(artifact from a shared store; measured)")
    ax.legend(fontsize=8)
