"""Compile caches on a new node without vLLM: what plancache's cache bundles save against a
plain copy and torch's mega-cache, on a small Llama-shaped model under ``torch.compile`` plus
custom Triton kernels (issue 32, item 5).

Five nodes, each a fresh process with its own ``TORCHINDUCTOR_CACHE_DIR``,
``TRITON_CACHE_DIR`` and ``TRITON_HOME`` at another absolute path:

- ``cold``: empty directories; it compiles everything. Once its first forward is done (off
  the measured time) it publishes: pushes both caches as plancache bundles to a local
  directory store (``PLANCACHE_URL=<dir>``, signed with a fresh key) through the public API
  (``plancache.caches``), and saves torch's mega-cache (``save_cache_artifacts``);
- ``warm``: the cold node's own directories again;
- ``bundles``: empty directories, filled by ``CacheShare.pull`` of both caches first;
- ``copy``: a ``cp -a`` of the cold node's directories (as published, before ``warm``);
- ``megacache``: empty directories, ``torch.compiler.load_cache_artifacts`` of the cold
  node's bytes first.

The cold node's directories are removed after ``warm`` and before the three new nodes run.
Per node: whole-process seconds (from the parent's ``Popen`` to the end of the first forward
and the custom kernels' first launches, set-up and pulls included, publishing excluded),
first-forward seconds, the custom kernels' first-launch seconds, and what it compiled,
counted by Inductor's own counters (``torch._dynamo.utils.counters["inductor"]``:
``fxgraph_cache_hit`` and ``_miss``, ...), by the runs of Inductor's C++ compiler into its
cache (``CppBuilder.build`` calls: its kernels on CPU) and by Triton's compilation listener
(``triton.knobs.compilation.listener``: every ``triton.compile`` with ``cache_hit`` true or
false, Inductor's kernels told from the custom ones by name), never by counting files
(Inductor's FX-graph cache re-emits bundled kernels, which file counts take for compiles);
and whether its outputs (the model's logits and every custom kernel's output on fixed
inputs) are ``torch.equal`` to the cold node's: a mismatch is a failure (exit status 1).

Inductor compiles Triton kernels in its own worker processes unless
``TORCHINDUCTOR_COMPILE_THREADS=1``, and a listener sees only its own process: the nodes run
with ``--compile-threads 1`` (the default) so that every Triton compile is counted; with
more, the Triton counts leave out Inductor's kernels (the JSON says so).

Run on a machine with a CUDA GPU: ``python -m benchmarks.gpu_caches --json gpu_caches.json``
(``--repeat 3`` for ranges). Without one it prints ``skipped: no CUDA GPU (<reason>)``, writes
that to ``--json`` and exits 0. ``--device cpu`` runs the same mechanics on the CPU
(Inductor generates C++ there; the custom Triton kernels are skipped, with the reason in the
output): ``benchmarks/test_gpu_caches.py`` runs it (the tiny model, the default on CPU).
Not part of the main job (``python -m benchmarks``) nor of CI's default run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("cold", "warm", "bundles", "copy", "megacache")
"""The nodes, in the order they run."""
NEW_NODES = ("bundles", "copy", "megacache")
"""The nodes that start without the cold node's directories."""
NODE_TIMEOUT_S = 1800.0
"""Most seconds one node process may take (a cold compile on a GPU: about 30 s)."""
COPY_TIMEOUT_S = 300.0
"""Most seconds ``cp -a`` of the cold node's directories may take."""
CUSTOM_SKIPPED_ON_CPU = (
    "the custom Triton kernels need a CUDA GPU (on CPU Inductor generates C++, and Triton "
    "launches nothing)"
)


@dataclass(frozen=True)
class ModelSize:
    """A Llama-shaped model: ``layers`` blocks of RMSNorm, attention with rotary embeddings
    and a SwiGLU MLP, an embedding and an output head; run on ``batch`` x ``seq`` tokens."""

    layers: int
    dim: int
    heads: int
    mlp: int
    vocab: int
    seq: int
    batch: int = 1


SIZES = {
    "small": ModelSize(layers=8, dim=1024, heads=16, mlp=2816, vocab=32000, seq=256),
    "tiny": ModelSize(layers=2, dim=64, heads=4, mlp=128, vocab=256, seq=16),
}
"""``small``: the issue's GPU run (8 layers); ``tiny``: the CPU test."""


# -- the node (a fresh process) ---------------------------------------------------------------
def build_model(size: ModelSize, device: str, dtype: Any) -> Any:
    """The model, with weights drawn from a fixed seed (every node builds the same one)."""
    import torch
    from torch import nn
    from torch.nn import functional

    class RMSNorm(nn.Module):  # type: ignore[misc]
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = 1e-6

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x32 = x.float()
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return (normed * self.weight.float()).to(x.dtype)

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.heads, self.head_dim = size.heads, size.dim // size.heads
            self.attn_norm, self.mlp_norm = RMSNorm(size.dim), RMSNorm(size.dim)
            self.qkv = nn.Linear(size.dim, 3 * size.dim, bias=False)
            self.out = nn.Linear(size.dim, size.dim, bias=False)
            self.gate_up = nn.Linear(size.dim, 2 * size.mlp, bias=False)
            self.down = nn.Linear(size.mlp, size.dim, bias=False)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).split(size.dim, dim=-1)
            q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            attn = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(attn.transpose(1, 2).reshape(b, s, size.dim))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
            return x + self.down(functional.silu(gate) * up)

    class Llama(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(size.vocab, size.dim)
            self.blocks = nn.ModuleList(Block() for _ in range(size.layers))
            self.norm = RMSNorm(size.dim)
            self.head = nn.Linear(size.dim, size.vocab, bias=False)
            head_dim = size.dim // size.heads
            inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            angles = torch.outer(torch.arange(size.seq).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens)
            cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
            for block in self.blocks:
                x = block(x, cos, sin)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Llama()
    return model.to(device=device, dtype=dtype).eval()


class TritonCounts:
    """Every ``triton.compile`` of this process through Triton's compilation listener:
    compiled (``cache_hit`` false) or found in Triton's cache, per kernel origin (a custom
    kernel by its name, else Inductor's)."""

    def __init__(self, custom: Sequence[str]) -> None:
        self.custom = frozenset(custom)
        self.compiled = {"inductor": 0, "custom": 0}
        self.cached = {"inductor": 0, "custom": 0}
        self.available = "not installed"

    def install(self) -> None:
        """Set the listener (Triton >= 3.4 has ``knobs.compilation.listener``); else say
        why nothing is counted."""
        try:
            import triton
        except ImportError:
            return
        knobs = getattr(triton, "knobs", None)
        compilation = getattr(knobs, "compilation", None)
        if compilation is None or not hasattr(compilation, "listener"):
            self.available = f"Triton {triton.__version__} has no knobs.compilation.listener"
            return
        compilation.listener = self
        self.available = "yes"

    def __call__(self, *, src: Any, cache_hit: bool, **_: Any) -> None:
        origin = "custom" if getattr(src, "name", "") in self.custom else "inductor"
        (self.cached if cache_hit else self.compiled)[origin] += 1


class CppBuilds:
    """Runs of Inductor's C++ compiler in this process (``CppBuilder.build`` calls, counted
    by a wrapper that changes nothing else): ``kernels``, those whose output goes to the
    Inductor cache (its kernels on CPU), and ``other`` (compiler probes into temporary
    directories, which every process runs)."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = os.path.realpath(cache_dir)
        self.kernels = 0
        self.other = 0

    def install(self) -> None:
        from torch._inductor import cpp_builder

        original = cpp_builder.CppBuilder.build

        def build(builder: Any, *args: Any, **kwargs: Any) -> Any:
            out = os.path.realpath(str(getattr(builder, "_output_dir", "")))
            if out == self.cache_dir or out.startswith(self.cache_dir + os.sep):
                self.kernels += 1
            else:
                self.other += 1
            return original(builder, *args, **kwargs)

        cpp_builder.CppBuilder.build = build


def _counters() -> dict[str, dict[str, int]]:
    """The non-zero counters of Inductor and AOTAutograd (torch's own bookkeeping)."""
    from torch._dynamo.utils import counters

    return {
        group: {k: int(v) for k, v in sorted(counters[group].items()) if v}
        for group in ("inductor", "aot_autograd")
    }


def _pull(store: str, key: str, device: str) -> dict[str, Any]:
    """Install the Triton and Inductor caches' bundles from ``store`` before compiling."""
    from plancache.caches import CacheShare, inductor_cache, triton_cache

    env = {**os.environ, "PLANCACHE_URL": store, "PLANCACHE_SIGNING_KEY": key}
    done: dict[str, Any] = {}
    with CacheShare.from_env(env) as share:
        for cache in _caches(triton_cache, inductor_cache, device, done):
            pulled = share.pull(cache)
            done[cache.kind] = {
                "reason": pulled.reason,
                "bundles": pulled.bundles,
                "files": pulled.installed,
                "seconds": round(pulled.seconds, 3),
            }
    return done


def _push(store: str, key: str, device: str) -> dict[str, Any]:
    """Store what this node's Triton and Inductor caches hold as bundles in ``store``."""
    from plancache.caches import CacheShare, inductor_cache, triton_cache

    env = {**os.environ, "PLANCACHE_URL": store, "PLANCACHE_SIGNING_KEY": key}
    done: dict[str, Any] = {}
    with CacheShare.from_env(env) as share:
        for cache in _caches(triton_cache, inductor_cache, device, done):
            pushed = share.push(cache)
            done[cache.kind] = {"files": pushed.files, "written": sum(pushed.written.values())}
    return done


def _caches(
    triton_cache: Any, inductor_cache: Any, device: str, notes: dict[str, Any]
) -> Iterator[Any]:
    """The two generated caches of this node (from its ``TRITON_CACHE_DIR`` and
    ``TORCHINDUCTOR_CACHE_DIR``); one that cannot be described here is noted, not raised."""
    from plancache.errors import ConfigError

    gpu = None if device == "cuda" else "none"
    for kind, make, var in (
        ("triton", triton_cache, "TRITON_CACHE_DIR"),
        ("inductor", inductor_cache, "TORCHINDUCTOR_CACHE_DIR"),
    ):
        try:
            yield make(os.environ[var], gpu=gpu)
        except ConfigError as exc:
            notes[kind] = {"skipped": str(exc)}


def run_node(spec: Mapping[str, Any]) -> None:
    """One node: set-up (pull or load where asked), the model's first forward under
    ``torch.compile``, the custom kernels' first launches; writes its result (and
    ``spec["result"]``'s outputs file) and, for the cold node, publishes afterwards."""
    import torch

    device: str = spec["device"]
    size = ModelSize(**spec["size"])
    result: dict[str, Any] = {"variant": spec["variant"]}
    custom: tuple[str, ...] = ()
    if device == "cuda":
        from benchmarks import gpu_kernels

        custom = gpu_kernels.NAMES
    triton_counts = TritonCounts(custom)
    triton_counts.install()
    cpp = CppBuilds(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    cpp.install()
    if spec.get("pull"):
        start = time.perf_counter()
        result["pull"] = _pull(spec["store"], spec["key"], device)
        result["pull_s"] = time.perf_counter() - start
    if spec.get("megacache_load"):
        start = time.perf_counter()
        info = torch.compiler.load_cache_artifacts(Path(spec["megacache_load"]).read_bytes())
        result["megacache_load_s"] = time.perf_counter() - start
        result["megacache_loaded"] = None if info is None else _info(info)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build_model(size, device, dtype)
    compiled = torch.compile(model, fullgraph=True)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen).to(device)
    start = time.perf_counter()
    with torch.no_grad():
        logits = compiled(tokens)
    if device == "cuda":
        torch.cuda.synchronize()
    result["first_forward_s"] = time.perf_counter() - start
    outputs: dict[str, Any] = {"logits": logits}
    if device == "cuda":
        from benchmarks import gpu_kernels

        start = time.perf_counter()
        outputs.update(gpu_kernels.run_all(dtype, rows=size.batch * size.seq, cols=size.dim))
        result["custom_kernels_s"] = time.perf_counter() - start
        result["custom_kernels"] = gpu_kernels.LAUNCHES
    else:
        result["custom_kernels"] = f"skipped: {CUSTOM_SKIPPED_ON_CPU}"
    result["ready_at"] = time.time()  # the end of what a boot waits for
    result["counters"] = _counters()
    result["cpp_builds"] = cpp.kernels
    result["cpp_other_builds"] = cpp.other
    result["triton"] = {
        "listener": triton_counts.available,
        "compiled": triton_counts.compiled,
        "cache_hits": triton_counts.cached,
    }
    torch.save({k: v.detach().cpu() for k, v in outputs.items()}, spec["outputs"])
    if spec.get("publish"):
        start = time.perf_counter()
        saved = torch.compiler.save_cache_artifacts()
        result["megacache_save_s"] = time.perf_counter() - start
        if saved is not None:
            Path(spec["megacache_save"]).write_bytes(saved[0])
            result["megacache_bytes"] = len(saved[0])
        start = time.perf_counter()
        result["push"] = _push(spec["store"], spec["key"], device)
        result["push_s"] = time.perf_counter() - start
    Path(spec["result"]).write_text(json.dumps(result, indent=1, default=str))


def _info(info: Any) -> dict[str, int]:
    """A ``CacheInfo`` as the number of artifacts of each kind it loaded."""
    fields = getattr(info, "artifacts", None) or {}
    return {str(k): len(v) for k, v in dict(fields).items()}


# -- the parent -------------------------------------------------------------------------------
def skip_reason(device: str) -> str | None:
    """Why the benchmark cannot run here on ``device``, or None if it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        build = torch.version.cuda
        why = "torch built without CUDA" if build is None else f"torch for CUDA {build} sees none"
        return f"{why}: torch {torch.__version__}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    return None


@dataclass(frozen=True)
class Node:
    """Where one node keeps its caches."""

    root: Path

    @property
    def inductor(self) -> Path:
        return self.root / "inductor"

    @property
    def triton(self) -> Path:
        return self.root / "triton"

    def env(self, base: Mapping[str, str], compile_threads: int) -> dict[str, str]:
        return {
            **base,
            "TORCHINDUCTOR_CACHE_DIR": str(self.inductor),
            "TRITON_CACHE_DIR": str(self.triton),
            "TRITON_HOME": str(self.root / "home"),
            "TORCHINDUCTOR_COMPILE_THREADS": str(compile_threads),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")])),
        }


def _base_env() -> dict[str, str]:
    """This environment without the settings that would change what a node does."""
    drop = ("TORCHINDUCTOR_", "TRITON_", "PLANCACHE_", "TORCH_COMPILE_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _run_node(
    variant: str, node: Node, spec: dict[str, Any], work: Path, env: dict[str, str]
) -> dict[str, Any]:
    """Run one node and return its result; a node that fails or times out gives
    ``{"error": ...}``."""
    spec = {
        **spec,
        "variant": variant,
        "result": str(work / f"{variant}.json"),
        "outputs": str(work / f"{variant}.pt"),
    }
    spec_path = work / f"{variant}.spec.json"
    spec_path.write_text(json.dumps(spec))
    for d in (node.inductor, node.triton, node.root / "home"):
        d.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "benchmarks.gpu_caches", "--node", str(spec_path)]
    started = time.time()
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=spec["node_timeout"],
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"timed out after {spec['node_timeout']:.0f} s"}
    ended = time.time()
    if done.returncode != 0 or not Path(spec["result"]).exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        return {"variant": variant, "error": f"exit {done.returncode}", "log": tail}
    result: dict[str, Any] = json.loads(Path(spec["result"]).read_text())
    result["whole_s"] = result.pop("ready_at") - started
    result["process_s"] = ended - started
    result["root"] = str(node.root)
    return result


def _copy(src: Node, dst: Node) -> None:
    """``cp -a`` of ``src``'s cache directories to ``dst``'s (another absolute path)."""
    dst.root.mkdir(parents=True, exist_ok=True)
    for a, b in ((src.inductor, dst.inductor), (src.triton, dst.triton)):
        subprocess.run(["cp", "-a", str(a), str(b)], check=True, timeout=COPY_TIMEOUT_S)


def _compare(results: dict[str, dict[str, Any]], work: Path) -> None:
    """Set each node's ``outputs_equal`` (every output ``torch.equal`` to the cold node's)
    and ``mismatched`` (the names that differ)."""
    import torch

    cold_path = work / "cold.pt"
    if "error" in results.get("cold", {"error": ""}) or not cold_path.exists():
        return
    cold = torch.load(cold_path)
    for variant, result in results.items():
        path = work / f"{variant}.pt"
        if "error" in result or not path.exists():
            continue
        mine = torch.load(path)
        wrong = sorted(
            k
            for k in cold.keys() | mine.keys()
            if k not in mine or k not in cold or not torch.equal(cold[k], mine[k])
        )
        result["outputs_equal"] = not wrong
        result["mismatched"] = wrong


def run_once(
    work: Path, device: str, size: ModelSize, compile_threads: int, node_timeout: float
) -> dict[str, dict[str, Any]]:
    """The five nodes once, under ``work`` (see the module); their results by variant."""
    base = _base_env()
    shutil.rmtree(work, ignore_errors=True)  # a run starts from nothing
    store = work / "store"
    store.mkdir(parents=True)
    spec: dict[str, Any] = {
        "device": device,
        "size": asdict(size),
        "store": str(store),
        "key": secrets.token_hex(32),
        "node_timeout": node_timeout,
    }
    nodes = {v: Node(work / "nodes" / v) for v in VARIANTS}
    nodes["warm"] = nodes["cold"]
    megacache = work / "megacache.bin"
    results: dict[str, dict[str, Any]] = {}
    cold = {**spec, "publish": True, "megacache_save": str(megacache)}
    results["cold"] = _run_node(
        "cold", nodes["cold"], cold, work, nodes["cold"].env(base, compile_threads)
    )
    if "error" in results["cold"]:
        return results
    _copy(nodes["cold"], nodes["copy"])  # as published, before the warm node adds anything
    results["warm"] = _run_node(
        "warm", nodes["warm"], spec, work, nodes["cold"].env(base, compile_threads)
    )
    shutil.rmtree(nodes["cold"].root)  # the producer's paths are gone for the new nodes
    extra = {
        "bundles": {"pull": True},
        "copy": {},
        "megacache": {"megacache_load": str(megacache)} if megacache.exists() else None,
    }
    for variant in NEW_NODES:
        more = extra[variant]
        if more is None:
            results[variant] = {"variant": variant, "error": "the cold node saved no mega-cache"}
            continue
        node = nodes[variant]
        results[variant] = _run_node(
            variant, node, {**spec, **more}, work, node.env(base, compile_threads)
        )
    _compare(results, work)
    return results


def failures(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """What went wrong: nodes that failed and outputs that differ from the cold node's."""
    found = []
    for i, run in enumerate(runs):
        for variant in VARIANTS:
            result = run.get(variant)
            if result is None:
                found.append(f"run {i}: {variant} did not run")
            elif "error" in result:
                found.append(f"run {i}: {variant}: {result['error']}")
            elif not result.get("outputs_equal", False):
                found.append(
                    f"run {i}: {variant}: outputs differ from cold's: {result.get('mismatched')}"
                )
    return found


def _span(values: Sequence[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.2f} s" if len(values) == 1 or hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f} s"


def _compiled(result: Mapping[str, Any]) -> str:
    """What the node compiled, from the counters: FX graphs, C++ kernels (on CPU) and
    Triton kernels (on a GPU)."""
    inductor = result.get("counters", {}).get("inductor", {})
    parts = [
        f"FX graphs: {inductor.get('fxgraph_cache_miss', 0)} compiled, "
        f"{inductor.get('fxgraph_cache_hit', 0)} from cache"
    ]
    on_gpu = isinstance(result.get("custom_kernels"), int)
    if result.get("cpp_builds") or not on_gpu:
        parts.append(f"C++ kernels built: {result.get('cpp_builds', 0)}")
    triton = result.get("triton", {})
    if triton.get("listener") != "yes":
        parts.append(f"Triton: not counted ({triton.get('listener', 'no listener')})")
    elif on_gpu or any(triton["compiled"].values()) or any(triton["cache_hits"].values()):
        c, h = triton["compiled"], triton["cache_hits"]
        parts.append(
            f"Triton: {c['inductor']} Inductor + {c['custom']} custom compiled "
            f"({h['inductor'] + h['custom']} from cache)"
        )
    return "; ".join(parts)


def table(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> str:
    """One row per node: ranges over the runs, and the last run's counts."""
    warm = [r["warm"]["whole_s"] for r in runs if "whole_s" in r.get("warm", {})]
    rows = [
        "| node | whole process | vs warm | first forward | custom kernels | compiled | outputs |"
    ]
    rows.append("|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        done = [r[variant] for r in runs if variant in r and "error" not in r[variant]]
        if not done:
            rows.append(f"| {variant} | failed | | | | | |")
            continue
        whole = [d["whole_s"] for d in done]
        ratio = (
            f"{sorted(whole)[len(whole) // 2] / sorted(warm)[len(warm) // 2]:.2f}x" if warm else "-"
        )
        custom = [d["custom_kernels_s"] for d in done if "custom_kernels_s" in d]
        equal = all(d.get("outputs_equal") for d in done)
        first = _span([d["first_forward_s"] for d in done])
        rows.append(
            f"| {variant} | {_span(whole)} | {ratio} | {first} "
            f"| {_span(custom) if custom else 'skipped'} | {_compiled(done[-1])} "
            f"| {'equal' if equal else 'DIFFER'} |"
        )
    return "\n".join(rows)


def versions() -> dict[str, str]:
    import importlib.metadata

    import plancache

    out = {"plancache": plancache.__version__}
    for package in ("torch", "triton"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[package] = importlib.metadata.version(package)
    return out


def _machine(device: str) -> dict[str, Any]:
    from benchmarks.machine import describe

    info = describe()
    if device == "cuda":
        import torch

        info["gpu"] = torch.cuda.get_device_name()
    return info


def _write(path: Path | None, report: Mapping[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, default=str))


@contextlib.contextmanager
def _workdir(given: Path | None, keep: bool) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given.resolve()
        return
    work = Path(tempfile.mkdtemp(prefix="plancache-gpu-caches-"))
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_caches",
        description="Compile caches on a new node without vLLM: cold, warm, plancache "
        "bundles, cp -a, torch's mega-cache (see the module docstring).",
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--size", choices=sorted(SIZES), default=None, help="default: small on cuda, tiny on cpu"
    )
    parser.add_argument("--layers", type=int, default=None, help="override the size's layers")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the five nodes")
    parser.add_argument(
        "--compile-threads", type=int, default=1, help="TORCHINDUCTOR_COMPILE_THREADS"
    )
    parser.add_argument(
        "--node-timeout", type=float, default=NODE_TIMEOUT_S, help="seconds per node"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the nodes' files here")
    parser.add_argument("--node", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--node``, one node); the exit status is 1 when a node
    failed or its outputs differ from the cold node's, else 0 (skipped included)."""
    args = _parser().parse_args(argv)
    if args.node is not None:
        run_node(json.loads(args.node.read_text()))
        return 0
    report: dict[str, Any] = {
        "benchmark": "gpu_caches",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": args.device,
    }
    reason = skip_reason(args.device)
    if reason is not None:
        line = f"skipped: no CUDA GPU ({reason})" if args.device == "cuda" else f"skipped: {reason}"
        print(line)
        _write(args.json, {**report, "skipped": line})
        return 0
    size = SIZES[args.size or ("small" if args.device == "cuda" else "tiny")]
    if args.layers is not None:
        size = ModelSize(**{**asdict(size), "layers": args.layers})
    report.update(
        machine=_machine(args.device),
        versions=versions(),
        model=asdict(size),
        compile_threads=args.compile_threads,
        custom_kernels=8 if args.device == "cuda" else f"skipped: {CUSTOM_SKIPPED_ON_CPU}",
    )
    if args.compile_threads != 1:
        report["triton_counts"] = (
            "Inductor's kernels compiled in its worker processes are not counted"
        )
    runs: list[dict[str, dict[str, Any]]] = []
    with _workdir(args.work_dir, keep=args.work_dir is not None) as work:
        for i in range(args.repeat):
            runs.append(
                run_once(
                    work / f"run{i}", args.device, size, args.compile_threads, args.node_timeout
                )
            )
    report["runs"] = runs
    report["failures"] = failures(runs)
    report["table"] = table(runs)
    _write(args.json, report)
    print(report["table"])
    for failure in report["failures"]:
        print(f"FAILED: {failure}")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
