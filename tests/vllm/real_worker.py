"""One boot of the REAL ``vllm.v1.worker.gpu_worker.Worker`` (vLLM 0.33.0) on a CPU-only
machine, in this process; prints one JSON line.

Real: ``VllmConfig`` (``EngineArgs`` on a local ``config.json``), plugin discovery
(``load_general_plugins``), ``Worker.__init__``/``init_device``/``load_model``/
``determine_available_memory``/``compile_or_warm_up_model``, ``init_worker_distributed_
environment`` and vLLM's world/TP/PP groups over gloo, ``MemorySnapshot``,
``memory_profiling``, ``request_memory``. Faked: the GPU memory counters (``torch.
accelerator``, a simulated 80 GiB device), the model runner, the ``current_platform``
methods that read a GPU, ``torch.ones`` inside ``gpu_worker`` (cuBLAS warm-up tensor) and
``kernel_warmup``.

usage: real_worker.py --model-dir DIR [--rank R --world-size N --port P] [--graphs]
    [--load-s S] [--kv-bytes B] [--device-kind cuda|xpu] [--free-gib G] [--save-wait S]
    [--seed KV BASELINE [--seed-options JSON]] [--die-in-warmup] [--compiled [--artifact]]
``--seed`` writes a record with this worker's key and one observation (KV and baseline in
bytes) straight to the store at ``PLANCACHE_URL`` (``--seed-options``, else
``PLANCACHE_STORAGE_OPTIONS``; no local tier) before ``load_model``: a record another node
wrote. ``--die-in-warmup`` prints the report, then SIGKILLs this process inside
``compile_or_warm_up_model`` (after the KV cache was allocated): a boot that dies with the
plan applied.
``--compiled``: the model is a ``support_torch_compile`` module as vLLM's compile path sees it
(``do_not_compile`` False, its AOT artifact at the path vLLM computes under
``VLLM_CACHE_ROOT``); the profile run loads that artifact where it exists, else compiles:
vLLM's compile counters move, the artifact is written, and the compile's temporaries add a
transient peak of ``COMPILE_TEMPORARIES`` over the activations (vLLM #54122).
``--artifact`` puts the artifact in place before ``load_model`` (a node that loads it).
Run with ``VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1`` and the checkout's root on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from types import SimpleNamespace
from typing import Any

from plancache._units import GiB
from tests.vllm.last_line import say

START = time.perf_counter()
COMPILE_TEMPORARIES = 8 * GiB
"""The transient peak a compiling profile run adds (``--compiled`` without an artifact)."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--port", type=int, default=29555)
    ap.add_argument("--graphs", action="store_true", help="cudagraph_mode != NONE")
    ap.add_argument("--load-s", type=float, default=0.0, help="simulated weight-load time")
    ap.add_argument("--kv-bytes", type=int, default=None, help="explicit kv_cache_memory_bytes")
    ap.add_argument("--device-kind", default="cuda", choices=["cuda", "xpu"])
    ap.add_argument("--free-gib", type=float, default=78.0, help="free memory at boot")
    ap.add_argument(
        "--save-wait",
        type=float,
        default=None,
        help="wait for the retractions and the save (default: twice PLANCACHE_TIMEOUT and 6 s)",
    )
    ap.add_argument("--seed", type=int, nargs=2, metavar=("KV", "BASELINE"), default=None)
    ap.add_argument("--seed-options", default=None, help="storage options of the seed (JSON)")
    ap.add_argument("--die-in-warmup", action="store_true")
    ap.add_argument("--compiled", action="store_true", help="a model vLLM compiles")
    ap.add_argument("--artifact", action="store_true", help="its AOT artifact is present")
    args = ap.parse_args()

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    import torch

    # ------------------------------------------------------------------ fake GPU memory
    TOTAL = 80 * GiB
    used = TOTAL - int(args.free_gib * GiB)  # by other processes
    mem = SimpleNamespace(used=used, allocated=0, peak=0, reserved=0)

    def alloc(n: int) -> None:  # simulated torch allocation
        mem.used += n
        mem.allocated += n
        mem.reserved += n
        mem.peak = max(mem.peak, mem.allocated)

    def free(n: int) -> None:
        mem.allocated -= n  # stays reserved (caching allocator) until empty_cache

    def empty_cache() -> None:
        mem.used -= mem.reserved - mem.allocated
        mem.reserved = mem.allocated

    acc = torch.accelerator
    acc.device_count = lambda: 8
    acc.is_available = lambda: True
    acc.set_device_index = lambda device: None
    acc.current_device_index = lambda: 0
    acc.synchronize = lambda device=None: None
    acc.empty_cache = empty_cache
    acc.get_memory_info = lambda device=None: (TOTAL - mem.used, TOTAL)
    acc.memory_stats = lambda device=None: {
        "allocated_bytes.all.peak": mem.peak,
        "allocated_bytes.all.current": mem.allocated,
    }
    acc.memory_reserved = lambda device=None: mem.reserved
    acc.memory_allocated = lambda device=None: mem.allocated

    def reset_peak(device: object = None) -> None:
        mem.peak = mem.allocated

    acc.reset_peak_memory_stats = reset_peak
    # _scoped_allocator_max_split returns early unless the allocator backend is "native"
    torch.cuda.memory.get_allocator_backend = lambda: "fake"

    # ------------------------------------------------------------------ platform
    from vllm.platforms import current_platform as p

    cls = type(p)
    cls.is_cuda_alike = lambda self: args.device_kind == "cuda"  # graph estimate path
    cls.logical_device_id_to_visible_device_id = classmethod(lambda c, i: i)
    cls.is_integrated_gpu = classmethod(lambda c, device_id=0: False)
    cls.check_if_supports_dtype = classmethod(lambda c, dtype: None)
    cls.get_device_name = classmethod(lambda c, device_id=0: f"Fake {args.device_kind} GPU")
    cls.get_device_total_memory = classmethod(lambda c, device_id=0: TOTAL)
    from vllm.platforms.interface import DeviceCapability

    cls.get_device_capability = classmethod(
        lambda c, device_id=0: DeviceCapability(9, 0) if args.device_kind == "cuda" else None
    )

    # ------------------------------------------------------------------ config (real)
    from vllm.engine.arg_utils import EngineArgs

    ea = EngineArgs(
        model=args.model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        enforce_eager=True,
        tensor_parallel_size=args.world_size,
        distributed_executor_backend="mp" if args.world_size > 1 else None,
        kv_cache_memory_bytes=args.kv_bytes,
    )
    configured = time.perf_counter()
    cfg = ea.create_engine_config()
    configured = time.perf_counter() - configured
    cfg.device_config.device_type = "cuda"  # init_device only supports "cuda"
    if args.graphs:
        from vllm.config import CUDAGraphMode

        cfg.model_config.enforce_eager = False
        cfg.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE

    # ------------------------------------------------------------------ gpu_worker (real)
    from vllm.plugins import load_general_plugins

    import plancache.integrations.vllm as plugin
    from plancache.errors import RankAgreementError

    load_general_plugins()  # real plugin discovery (plancache entry point)
    import vllm.v1.worker.gpu_worker as gw

    # only after the imports: is_xpu() at import time selects XPU-only modules
    cls.is_xpu = lambda self: args.device_kind == "xpu"

    class _TorchProxy:
        """gpu_worker's `torch`, except that tensors asked for on cuda:N land on CPU."""

        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def ones(*a: Any, device: object = None, **k: Any) -> Any:
            return torch.ones(*a, **k)

    gw.torch = _TorchProxy()
    # kernel_warmup (DeepGEMM/FlashInfer autotune, MiniMax warmups) is GPU-only and imports
    # torchvision on this install: the only gpu_worker-level function replaced.
    gw.kernel_warmup = lambda worker: None

    events: list[str] = []

    class CompiledModel:
        """A ``support_torch_compile`` module as vLLM's AOT path and plancache see it."""

        do_not_compile = False

        def __init__(self, vllm_config: object) -> None:
            self.vllm_config = vllm_config

        def forward(self, x: Any) -> Any:
            return x

        def artifact(self) -> Any:
            from plancache.integrations.vllm.compiling import aot_path

            where = aot_path(self)
            assert where is not None, "vLLM would keep no AOT artifact"
            return where[0] / where[1] / "model"

    class FakeRunner:
        """The model runner: weights, profile run and graph capture move the fake counter."""

        model_memory_usage = 0
        is_pooling_model = False
        lora_config = None

        def __init__(self, vllm_config: object, device: object) -> None:
            self.device = device
            self.model: Any = CompiledModel(vllm_config) if args.compiled else None

        def load_model(self, load_dummy_weights: bool = False) -> None:
            time.sleep(args.load_s)
            alloc(16 * GiB)
            self.model_memory_usage = 16 * GiB
            if args.artifact:
                self.model.artifact().parent.mkdir(parents=True, exist_ok=True)
                self.model.artifact().write_bytes(b"compiled")

        def get_model(self) -> Any:
            return self.model if args.compiled else torch.nn.Linear(1, 1)

        def profile_run(self, randomize_inputs: bool = False) -> None:
            events.append("profile_run")
            if args.compiled:
                from vllm.compilation.counter import compilation_counter

                if self.model.artifact().exists():
                    compilation_counter.num_aot_artifacts_loaded += 1
                    events.append("aot-loaded")
                else:  # compiles: its temporaries peak above the activations, then go
                    alloc(COMPILE_TEMPORARIES)
                    free(COMPILE_TEMPORARIES)
                    compilation_counter.num_aot_compiles += 1
                    compilation_counter.num_backend_compilations += 1
                    self.model.artifact().parent.mkdir(parents=True, exist_ok=True)
                    self.model.artifact().write_bytes(b"compiled")
                    events.append("compiled")
            alloc(3 * GiB)  # activation peak
            free(3 * GiB)
            mem.used += 256 << 20  # non-torch (attention workspace etc.)

        def profile_cudagraph_memory(self) -> int:
            events.append("cudagraph-estimate")
            return 1 * GiB

        def capture_model(self) -> int:
            mem.used += 1 * GiB
            return 1 * GiB

        def maybe_remove_all_loras(self, lora_config: object) -> None:
            if args.die_in_warmup:  # inside compile_or_warm_up_model, the KV cache allocated
                boot = plugin.boot_of(worker)
                applied = None if boot is None or boot.decision is None else boot.decision
                print(
                    json.dumps(
                        {
                            "died": True,
                            "mode": None if boot is None else boot.mode,
                            "kv": worker.cache_config.kv_cache_memory_bytes,
                            "reason": None if applied is None else applied.reason,
                            "observation": None
                            if applied is None or applied.observation is None
                            else applied.observation.digest,
                            "marked": None if boot is None or boot.mark is None else True,
                        }
                    ),
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)

        def _dummy_run(self, num_tokens: int, **kw: Any) -> tuple[Any, Any]:
            h = torch.zeros(num_tokens, 4)
            return h, h

        def _dummy_sampler_run(self, hidden_states: object = None) -> None:
            return None

    gw.Worker._make_model_runner = lambda self: FakeRunner(self.vllm_config, self.device)
    from vllm.v1.worker import gpu_model_runner  # vLLM 0.31/0.32: init_device builds it by name

    gpu_model_runner.GPUModelRunner = FakeRunner

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(args.port),
        RANK=str(args.rank),
        LOCAL_RANK=str(args.rank),
        WORLD_SIZE=str(args.world_size),
    )
    from vllm.config import set_current_vllm_config

    t = {}
    with set_current_vllm_config(cfg):
        worker = gw.Worker(
            vllm_config=cfg,
            local_rank=args.rank,
            rank=args.rank,
            distributed_init_method=f"tcp://127.0.0.1:{args.port}",
            is_driver_worker=args.rank == 0,
        )
        s = time.perf_counter()
        worker.init_device()
        t["init_device"] = time.perf_counter() - s
        if args.seed is not None:
            seed(worker, args.seed[0], args.seed[1], args.seed_options)
        s = time.perf_counter()
        worker.load_model()
        t["load_model"] = time.perf_counter() - s
        s = time.perf_counter()
        try:
            kv = worker.determine_available_memory()
        except RankAgreementError as exc:
            say({"rank": args.rank, "error": str(exc)})
            os._exit(3)  # the group holds a pending collective: no clean teardown
        t["determine"] = time.perf_counter() - s
        s = time.perf_counter()
        worker.compile_or_warm_up_model()
        t["warmup"] = time.perf_counter() - s
        t["ready"] = time.perf_counter() - START  # process start to a ready worker
        t["engine_config"] = configured
        from vllm.distributed.parallel_state import get_world_group

        wg = get_world_group()
        # the next world-group collective still pairs correctly
        x = torch.tensor([args.rank + 1])
        torch.distributed.all_reduce(x, group=wg.cpu_group)

    boot = plugin.boot_of(worker)
    # the retractions and the save each end within the boot's budget
    save_wait = args.save_wait
    if save_wait is None:
        from plancache._defaults import TIMEOUT

        save_wait = 2 * TIMEOUT.read() + 6.0
    recorded = plugin.wait_saved(worker, save_wait)
    report = {
        "rank": args.rank,
        "kv": kv,
        "available_kv": getattr(worker, "available_kv_cache_memory_bytes", None),
        "requested_memory": worker.requested_memory,
        "init_free": worker.init_snapshot.free_memory,
        "weights": worker.model_runner.model_memory_usage,
        "device": str(worker.device),
        "cpu_timeout": str(getattr(wg, "cpu_timeout", None)),  # vLLM 0.33 sets one
        "world_allreduce": int(x.item()),
        "times": t,
        "events": events,
        "mode": None if boot is None else boot.mode,
        "reason": None if boot is None or boot.decision is None else boot.decision.reason,
        "factors": None if boot is None else boot.factors,
        "labels": None if boot is None else boot.labels,
        "costs": None if boot is None else boot.costs,
        "tally": None if boot is None or boot.tally is None else vars(boot.tally),
        "saved": None if recorded is None else recorded.reason,
        "avoid": [] if boot is None else sorted(boot.avoid),
        "mark_left": None if boot is None else boot.mark is not None,
        "compiles": None if boot is None else boot.compiles,
        "compiled": None if boot is None else boot.compiled,
        "provisional": None
        if boot is None or boot.decision is None or boot.decision.plan is None
        else boot.decision.observation in boot.decision.plan.provisional,
    }
    say(report)
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    destroy_model_parallel()
    destroy_distributed_environment()


def seed(worker: Any, kv: int, baseline: int, options: str | None) -> None:
    """Write a record with ``worker``'s key and one observation straight to the store at
    ``PLANCACHE_URL`` (no local tier)."""
    from plancache import Plan, open_store
    from plancache._defaults import parse_storage_options
    from plancache.integrations.vllm import worker_factors
    from plancache.integrations.vllm.factors import as_scalars

    text = os.environ.get("PLANCACHE_STORAGE_OPTIONS", "") if options is None else options
    store = open_store(os.environ["PLANCACHE_URL"], **parse_storage_options(text, "seed"))
    plan = Plan.new(
        as_scalars(worker_factors(worker)),
        kv_cache_memory_bytes=kv,
        free_memory_baseline=baseline,
        producer={"host": "another-node"},
    )
    store.put(plan)
    store.close()


if __name__ == "__main__":
    main()
