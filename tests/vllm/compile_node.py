"""One "node": a fresh process that runs vLLM 0.33.0's real ``support_torch_compile`` path on
CPU for a tiny model and prints one JSON line (its counters and timings).

Real: ``VllmConfig`` (``EngineArgs`` on a local ``config.json``), plugin discovery
(``load_general_plugins``, so plancache's ``register`` runs as in any vLLM process), the
``@support_torch_compile`` decorator in ``VLLM_COMPILE`` mode with AOT compile (Dynamo,
Inductor, vLLM's backend), vLLM's own AOT save and load under ``VLLM_CACHE_ROOT``.

CPU-only shims, here and never in the plugin (they stand for what a GPU platform does):
vLLM's CPU platform downgrades ``VLLM_COMPILE`` to ``DYNAMO_TRACE_ONCE`` (whose AOT loads
fail), so the mode is set back after the config is built; the CUDA wheel lacks ``vllm._C``,
which ``FixFunctionalizationPass`` and the quant fusions need, so that pass is a no-op and
the fusions are off; ``compile_sizes`` is unset
without a model runner, so it is set to ``[]``.

usage: compile_node.py --model-dir DIR [--die-after-load] [--wait-upload S] [--sizes N ...]
    [--other-loader] [--vllm-metrics] [--engine-arg NAME=JSON ...]
``--sizes`` sets vLLM's ``compile_sizes`` and runs one forward of each size after the first
(the warm-up a model runner does: it compiles or loads those sizes).
``--die-after-load`` SIGKILLs the process inside the first forward, right after vLLM loaded
the artifact (a boot that dies with it). After the first forward the node is ready: it calls
plancache's ``caches.ready`` as a ``Worker`` does once its warm-up returned (what vLLM added
to ``inductor_cache/`` since it saved the artifact is uploaded then). ``--wait-upload`` waits
that long for plancache's background uploads before exiting (0: leave it to the exit bound).
``--vllm-metrics`` makes vLLM's Prometheus metrics (``PrometheusStatLogger``) as its API
server does. ``--other-loader`` gives vLLM's AOT loader other parameters before the plugins
load (as a vLLM whose internals moved would have it). ``--engine-arg`` passes one more
``EngineArgs`` field (``dtype="float16"``, ``max_model_len=256``). The report's ``output`` is
the sha256 of the first forward's output bytes: equal outputs, bit for bit.
Run with ``VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1`` and the checkout's root on the path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from typing import Any

from tests.vllm.last_line import say

START = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--die-after-load", action="store_true")
    ap.add_argument("--wait-upload", type=float, default=0.0)
    ap.add_argument("--sizes", type=int, nargs="*", default=[])
    ap.add_argument("--other-loader", action="store_true")
    ap.add_argument("--vllm-metrics", action="store_true")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="NAME=JSON")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    import torch
    from torch import nn
    from vllm.compilation.counter import compilation_counter
    from vllm.compilation.decorators import support_torch_compile
    from vllm.compilation.passes.utility import fix_functionalization
    from vllm.config import CompilationMode, VllmConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.models import registry

    imported = time.perf_counter()
    inspect_s = _timed(registry._LazyRegisteredModel, "inspect_model_cls")
    from vllm.plugins import load_general_plugins

    inspections: list[str] = []  # a probe on vLLM's own subprocess inspection (still runs it)
    inspect_in_subprocess = registry._run_in_subprocess

    def counted(fn: Any) -> Any:
        inspections.append("subprocess")
        return inspect_in_subprocess(fn)

    registry._run_in_subprocess = counted
    if args.other_loader:  # a vLLM whose AOT loader has other parameters (another version)
        from vllm.compilation import decorators

        loader = decorators._try_load_aot_compiled_fn

        def _try_load_aot_compiled_fn(model: Any, path: str, strict: bool = False) -> Any:
            return loader(model, path)

        decorators._try_load_aot_compiled_fn = _try_load_aot_compiled_fn
    load_general_plugins()  # plancache's register(), as in every vLLM process
    fix_functionalization.FixFunctionalizationPass.__call__ = lambda self, graph: None  # shim

    configured = time.perf_counter()
    engine_args = EngineArgs(
        model=args.model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        enforce_eager=True,
        **{k: json.loads(v) for k, v in (a.split("=", 1) for a in args.engine_arg)},
    )
    config: VllmConfig = engine_args.create_engine_config()
    configured = time.perf_counter() - configured
    config.compilation_config.mode = CompilationMode.VLLM_COMPILE  # shim: CPU downgrades it
    config.compilation_config.backend = "inductor"
    config.compilation_config.compile_sizes = list(args.sizes)  # shim: no model runner sets it
    passes = config.compilation_config.pass_config
    for name in ("fuse_norm_quant", "fuse_act_quant"):  # shim: CUDA fusions (need vllm._C)
        setattr(passes, name, False)
    if args.vllm_metrics:  # vLLM's own Prometheus metrics, as its API server makes them
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        PrometheusStatLogger(config)

    @support_torch_compile(dynamic_arg_dims={"x": 0})
    class Tiny(nn.Module):  # type: ignore[misc]
        def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
            super().__init__()
            self.up = nn.Linear(64, 128)
            self.down = nn.Linear(128, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.nn.functional.silu(self.up(x))) + x

    torch.manual_seed(0)
    with set_current_vllm_config(config):
        model = Tiny(vllm_config=config)
    x = torch.randn(8, 64)
    with torch.no_grad():
        eager = model.forward(x)

    if args.die_after_load:
        from vllm.compilation import decorators

        loader = decorators._try_load_aot_compiled_fn

        def load_then_die(*a: Any, **kw: Any) -> Any:
            fn = loader(*a, **kw)
            if fn is not None:
                say({"loaded": True, "dying": True})
                os.kill(os.getpid(), signal.SIGKILL)
            return fn

        decorators._try_load_aot_compiled_fn = load_then_die

    first = time.perf_counter()
    with set_current_vllm_config(config), set_forward_context(None, config), torch.no_grad():
        out = model(x)
    first_forward = time.perf_counter() - first
    warm_up = time.perf_counter()
    for size in args.sizes:  # the model runner's warm-up
        with set_current_vllm_config(config), set_forward_context(None, config), torch.no_grad():
            model(torch.randn(size, 64))
    warm_up = time.perf_counter() - warm_up
    from plancache.integrations.vllm import caches
    from plancache.integrations.vllm import compile as share

    caches.ready()  # as Worker.compile_or_warm_up_model's wrapper does
    waited = None
    if args.wait_upload:
        t = time.perf_counter()
        share.uploads.wait(args.wait_upload)
        waited = time.perf_counter() - t
    report = {
        "first_forward_s": first_forward,
        "inductor_files": _files(os.environ["VLLM_CACHE_ROOT"], "inductor_cache"),
        "process_s": time.perf_counter() - START,
        "loaded_from_disk": bool(getattr(model, "was_aot_compile_fn_loaded_from_disk", False)),
        "aot_compiles": compilation_counter.num_aot_compiles,
        "aot_loaded": compilation_counter.num_aot_artifacts_loaded,
        "aot_saved": compilation_counter.num_aot_artifacts_saved,
        "equal_eager": bool(torch.allclose(out, eager, atol=1e-5)),
        "output": hashlib.sha256(out.detach().float().numpy().tobytes()).hexdigest(),
        "upload_wait_s": waited,
        "inspections": len(inspections),  # model classes vLLM inspected in a subprocess
        "phases_s": {  # the process by phase (first forward: compile or load)
            "import vLLM and torch": imported - START,
            "engine config": configured,
            "of which model inspection (inspect_model_cls)": sum(inspect_s),
            "first forward": first_forward,
            "warm-up": warm_up,
        },
    }
    say(report)


def _files(root: str, part: str) -> int:
    """How many files lie below ``root`` in directories named ``part`` (lock files aside)."""
    return sum(
        1
        for dirpath, _, names in os.walk(root)
        if part in dirpath.split(os.sep)
        for name in names
        if not name.endswith(".lock")
    )


def _timed(cls: Any, method: str) -> list[float]:
    """The seconds of each call of ``cls.method`` from now on: the span vLLM's own
    ``@logtime`` line for it measures (vLLM logs that line at DEBUG, and reconfigures its
    loggers while it builds the engine config, so it is timed here instead)."""
    found: list[float] = []
    original = getattr(cls, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            found.append(time.perf_counter() - start)

    setattr(cls, method, timed)
    return found


if __name__ == "__main__":
    main()
