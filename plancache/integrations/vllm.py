"""vLLM general plugin: skip KV-cache memory profiling at boot with a plan from any store.

Registered under the entry-point group ``vllm.general_plugins`` as ``plancache``; vLLM calls
:func:`register` once per process (API server, engine core, each worker). It does nothing
unless enabled: ``PLANCACHE_URL`` set, ``PLANCACHE_ENABLE=1``, or vLLM's own
``VLLM_ENABLE_STARTUP_PLAN=1`` (then plancache replaces vLLM's built-in startup plan, which
neither applies nor saves anything). ``PLANCACHE_ENABLE=0`` turns it off whatever else is set.

When enabled, it wraps ``vllm.v1.worker.gpu_worker.Worker``'s
``determine_available_memory`` (look up, agree across ranks, apply) and
``compile_or_warm_up_model`` (save after it returned), as soon as that module is imported,
so processes that never import it (the API server) pay nothing. Guarantees:

- an explicit ``--kv-cache-memory-bytes`` is always respected: no lookup, no save;
- the fingerprint is computed once, at lookup, and the save uses the same factors, however
  the config changes during startup;
- a plan is applied only if every rank of the worker group can apply its own; if the
  agreement itself fails, this rank profiles;
- a plan is saved only by a boot that profiled, after ``compile_or_warm_up_model`` returned,
  and it records what that boot allocated (``available_kv_cache_memory_bytes``);
- nothing here raises into vLLM's boot path because of a store, a config or a missing
  attribute; a vLLM without the wrapped methods gets one warning and no patch.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any, TypeVar

from plancache.cache import Decision, PlanCache, Recorded
from plancache.config import parse_bool
from plancache.errors import ConfigError
from plancache.plan import Scalar
from plancache.reasons import Reason

log = logging.getLogger("plancache.vllm")

TARGET_MODULE = "vllm.v1.worker.gpu_worker"
"""The module whose ``Worker`` class is wrapped."""
WRAPPED_METHODS = ("determine_available_memory", "compile_or_warm_up_model")
BUILTIN_FUNCTIONS = ("maybe_apply_startup_plan", "maybe_save_startup_plan")
"""vLLM's built-in startup-plan functions, replaced in ``TARGET_MODULE`` by no-ops."""
AGREEMENT_TIMEOUT_S = 300.0
"""Longest wait for the other ranks to reach the agreement; past it this rank profiles."""

_STATE_ATTR = "_plancache_boot"
_MARK = "__plancache_wrapped__"
_GiB = float(1 << 30)

T = TypeVar("T")
_lock = threading.Lock()
_registered = False
_cache: PlanCache | None = None


# --------------------------------------------------------------------------- enabling


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True if the plugin should act: ``PLANCACHE_ENABLE`` decides when set; otherwise
    ``PLANCACHE_URL`` set or ``VLLM_ENABLE_STARTUP_PLAN=1``. A malformed value: warning, off."""
    env = os.environ if environ is None else environ
    try:
        explicit = env.get("PLANCACHE_ENABLE", "").strip()
        if explicit:
            return parse_bool("PLANCACHE_ENABLE", explicit)
        builtin = parse_bool("VLLM_ENABLE_STARTUP_PLAN", env.get("VLLM_ENABLE_STARTUP_PLAN", "0"))
        return bool(env.get("PLANCACHE_URL")) or builtin
    except ConfigError as exc:
        log.warning("plancache: vLLM plugin disabled: %s", exc)
        return False


def register() -> None:
    """vLLM's entry point. Idempotent and cheap: when enabled, patches the GPU worker now if
    its module is loaded, else when it is first imported; never raises."""
    global _registered
    patched = False
    with _lock:
        if _registered:
            return
        _registered = True
        try:
            if not enabled():
                return
            _route_logs_to_vllm()
            module = sys.modules.get(TARGET_MODULE)
            if module is not None:
                patched = patch_worker_module(module)
            elif _module_exists(TARGET_MODULE):
                sys.meta_path.insert(0, _PatchOnImport())
            else:
                log.warning("plancache: this vLLM has no %s; plugin inactive", TARGET_MODULE)
        except Exception:
            log.warning("plancache: vLLM plugin failed to register; inactive", exc_info=True)
    if patched:
        _safely(_warm)


def _warm() -> None:
    """Open the store in the background while the worker loads its model, so that the
    lookup's time budget is spent on the request, not on importing a client library."""
    _get_cache().warm()


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _route_logs_to_vllm() -> None:
    """Send plancache's lines through the ``vllm`` logger (its handler, format and
    ``VLLM_LOGGING_LEVEL``), unless the ``plancache`` logger is configured already."""
    try:
        import vllm.envs as envs
    except ImportError:
        return
    ours = logging.getLogger("plancache")
    if ours.handlers:
        return
    level = logging.getLevelName(str(envs.VLLM_LOGGING_LEVEL).upper())
    ours.setLevel(level if isinstance(level, int) else logging.INFO)
    ours.addHandler(_ForwardTo(logging.getLogger("vllm")))
    ours.propagate = False


class _ForwardTo(logging.Handler):
    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.handle(record)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``TARGET_MODULE`` through the other finders and patches it once executed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if isinstance(spec.loader, importlib.abc.Loader) and hasattr(
                spec.loader, "exec_module"
            ):
                spec.loader = _PatchingLoader(spec.loader, self)
            return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, finder: _PatchOnImport) -> None:
        self.inner = inner
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        try:
            patched = patch_worker_module(module)
        except Exception:
            log.warning("plancache: could not patch %s; inactive", module.__name__, exc_info=True)
            return
        if patched:
            _safely(_warm)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# --------------------------------------------------------------------------- patching


def patch_worker_module(module: ModuleType) -> bool:
    """Wrap ``module.Worker``'s two methods and replace the module's built-in startup-plan
    functions by no-ops. True if patched (now or before); False, with one warning, if the
    class or a method is missing (nothing is changed then)."""
    worker_cls = getattr(module, "Worker", None)
    missing = [m for m in WRAPPED_METHODS if not callable(getattr(worker_cls, m, None))]
    if worker_cls is None or missing:
        log.warning(
            "plancache: %s.Worker lacks %s; vLLM plugin inactive",
            module.__name__,
            ", ".join(missing) or "the class",
        )
        return False
    if getattr(worker_cls.determine_available_memory, _MARK, False):
        return True
    worker_cls.determine_available_memory = _wrap_determine(worker_cls.determine_available_memory)
    worker_cls.compile_or_warm_up_model = _wrap_warmup(worker_cls.compile_or_warm_up_model)
    for name in BUILTIN_FUNCTIONS:
        if hasattr(module, name):
            setattr(module, name, _builtin_replaced)
    log.debug("plancache: patched %s.Worker", module.__name__)
    return True


def _wrap_determine(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def determine_available_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        _safely(_apply, self)
        return original(self, *args, **kwargs)

    setattr(determine_available_memory, _MARK, True)
    return determine_available_memory


def _wrap_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _safely(_save, self, getattr(self, "available_kv_cache_memory_bytes", None))
        return result

    setattr(compile_or_warm_up_model, _MARK, True)
    return compile_or_warm_up_model


def _safely(fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None with a warning if it raises: the boot goes on either way."""
    try:
        return fn(*args)
    except Exception:
        log.warning("plancache: %s failed; booting as usual", fn.__name__, exc_info=True)
        return None


def _builtin_replaced(*args: object, **kwargs: object) -> None:
    """Stands in for vLLM's built-in startup-plan functions: plancache does their job."""


# --------------------------------------------------------------------------- factors


def software_factors() -> dict[str, Scalar]:
    """vLLM and torch builds, and the vLLM setting that changes the profiled value."""
    import torch
    import vllm
    import vllm.envs as envs

    return {
        "vllm": str(vllm.__version__),
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda or getattr(torch.version, "hip", None) or ""),
        "estimate_cudagraphs": bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS),
    }


def device_factors(device: object) -> dict[str, Scalar]:
    """Name, total memory and compute capability of ``device`` (the worker's own)."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "device_name": str(props.name),
        "device_total_memory": int(props.total_memory),
        "device_capability": f"{props.major}.{props.minor}",
    }


def worker_factors(worker: Any) -> dict[str, Scalar]:
    """Everything the profiled KV-cache size of this worker depends on: software, the
    worker's device, ``VllmConfig.compute_hash()``, ``gpu_memory_utilization``, rank and
    world size."""
    return {
        **software_factors(),
        **device_factors(worker.device),
        "vllm_config": str(worker.vllm_config.compute_hash()),
        "gpu_memory_utilization": float(worker.cache_config.gpu_memory_utilization),
        "rank": int(worker.rank),
        "world_size": int(worker.parallel_config.world_size),
    }


# --------------------------------------------------------------------------- apply / save


@dataclass
class _Boot:
    """What this worker decided at lookup; the save reuses it."""

    mode: str  # "explicit", "applied" or "profiling"
    factors: dict[str, Scalar] | None = None
    free_memory: object = None
    saved: bool = False


def maybe_apply_startup_plan(worker: Any) -> Decision | None:
    """vLLM's ``maybe_apply_startup_plan`` on the configured store: if enabled and no
    explicit ``kv_cache_memory_bytes`` is set, set it from a plan that this worker's gate and
    every rank's accept. The decision, or None when nothing was looked up. Never raises."""
    return _safely(_apply, worker) if enabled() else None


def maybe_save_startup_plan(worker: Any, kv_cache_memory_bytes: int) -> Recorded | None:
    """vLLM's ``maybe_save_startup_plan`` on the configured store: record
    ``kv_cache_memory_bytes`` under the key of this worker's lookup, only if enabled and this
    boot profiled, once per boot. The result, or None when nothing was stored. Never raises."""
    return _safely(_save, worker, kv_cache_memory_bytes) if enabled() else None


def _get_cache() -> PlanCache:
    global _cache
    with _lock:
        if _cache is None:
            _cache = PlanCache.from_env()
        return _cache


def _apply(worker: Any) -> Decision | None:
    if getattr(worker, _STATE_ATTR, None) is not None:
        return None  # decided once per worker
    rank = getattr(worker, "rank", "?")
    explicit = worker.cache_config.kv_cache_memory_bytes
    if explicit is not None:
        setattr(worker, _STATE_ATTR, _Boot("explicit"))
        log.info(
            "plancache: rank %s: kv_cache_memory_bytes=%s set explicitly; no lookup, no save",
            rank,
            explicit,
        )
        return None
    decision, factors, free = _lookup(worker)
    can_apply = decision.kv_cache_memory_bytes is not None
    agreed, agreement = _agree(can_apply)
    boot = _Boot("profiling", factors, free)
    fp = (decision.fingerprint or "-")[:12]
    if can_apply and agreed:
        kv = decision.kv_cache_memory_bytes
        worker.cache_config.kv_cache_memory_bytes = kv
        boot.mode = "applied"
        log.info(
            "plancache: rank %s applies plan fp=%s: kv_cache_memory_bytes=%s (%.2f GiB), "
            "memory profiling skipped%s",
            rank,
            fp,
            kv,
            (kv or 0) / _GiB,
            agreement,
        )
    else:
        why = decision.reason if not can_apply else "another rank cannot apply its plan"
        log.info("plancache: rank %s profiles (%s) fp=%s%s", rank, why, fp, agreement)
    setattr(worker, _STATE_ATTR, boot)
    return decision


def _key(worker: Any) -> tuple[dict[str, Scalar], object]:
    """(factors, free memory at boot start) of this worker; raises what the worker raises."""
    return worker_factors(worker), worker.init_snapshot.free_memory


def _lookup(worker: Any) -> tuple[Decision, dict[str, Scalar] | None, object]:
    """(decision, factors, free memory at boot); factor or config errors become an
    ``error`` decision, logged here because the cache never saw them."""
    start = time.perf_counter()
    try:
        factors, free = _key(worker)
        cache = _get_cache()
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        log.warning("plancache: rank %s: no lookup: %s", getattr(worker, "rank", "?"), detail)
        return (
            Decision(None, Reason.ERROR, None, time.perf_counter() - start, None, detail),
            None,
            None,
        )
    return cache.lookup(factors, current_free_memory=free), factors, free


def _agreement_group() -> Any:
    """vLLM's CPU (gloo) world group when vLLM set one up, else torch's default group."""
    parallel_state = sys.modules.get("vllm.distributed.parallel_state")
    if parallel_state is not None:
        try:
            return parallel_state.get_world_group().cpu_group
        except Exception:
            pass
    return None


def _agree(can_apply: bool) -> tuple[bool, str]:
    """(every rank can apply, note for the log). Without torch.distributed, or alone in the
    group: this rank's own answer. A failed or timed-out agreement: False."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return can_apply, ""
    if not (dist.is_available() and dist.is_initialized()):
        return can_apply, ""
    try:
        group = _agreement_group()
        size = dist.get_world_size(group)
        if size <= 1:
            return can_apply, ""
        flag = torch.tensor([1 if can_apply else 0], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group, async_op=True)
        work.wait(timeout=timedelta(seconds=AGREEMENT_TIMEOUT_S))
        agreed = bool(flag.item())
    except Exception as exc:
        return False, f"; rank agreement failed ({type(exc).__name__}: {exc})"
    return agreed, f"; {size} ranks agreed" if agreed else f"; not all {size} ranks can apply"


def _save(worker: Any, kv_cache_memory_bytes: object) -> Recorded | None:
    rank = getattr(worker, "rank", "?")
    boot = getattr(worker, _STATE_ATTR, None)
    if boot is None:  # a key computed now could differ from any lookup's (vLLM defect 4)
        log.info("plancache: rank %s: not saved: no lookup ran on this worker", rank)
        return None
    if boot.mode != "profiling" or boot.saved or boot.factors is None:
        return None
    kv = _as_int(kv_cache_memory_bytes)
    free = _as_int(boot.free_memory)
    if kv is None or free is None:
        log.warning(
            "plancache: rank %s: not saved: KV-cache size %r, free memory at boot %r",
            rank,
            kv_cache_memory_bytes,
            boot.free_memory,
        )
        return None
    boot.saved = True
    try:
        cache = _get_cache()
    except ConfigError as exc:
        log.warning("plancache: rank %s: not saved: %s", rank, exc)
        return None
    return cache.record(boot.factors, kv_cache_memory_bytes=kv, free_memory_baseline=free)


def _as_int(value: object) -> int | None:
    """``value`` as an int if it is one (or an integral float); bool and others: None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
