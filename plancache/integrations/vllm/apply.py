"""Apply and save: the lookup at ``determine_available_memory``, the save after
``compile_or_warm_up_model``, the boot state that ties them, and the process's cache.

Guarantees: an explicit ``kv_cache_memory_bytes`` is respected (no lookup, no save); the key
is computed once, at lookup, and the save reuses it; a plan is applied only if every rank
agrees; a plan is saved only by a boot that profiled, once, with what that boot allocated.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from plancache.cache import Decision, PlanCache, Recorded
from plancache.errors import ConfigError
from plancache.integrations.vllm.agreement import agree
from plancache.integrations.vllm.enable import enabled
from plancache.integrations.vllm.factors import WorkerFactors, as_scalars, worker_factors
from plancache.integrations.vllm.worker import WorkerLike
from plancache.reasons import Reason

log = logging.getLogger("plancache.vllm")

STATE_ATTR = "_plancache_boot"
"""The worker attribute that holds its ``Boot``."""
_GiB = float(1 << 30)

P = ParamSpec("P")
T = TypeVar("T")
_lock = threading.Lock()
_cache: PlanCache | None = None


class BootMode(enum.StrEnum):
    """How this worker sizes its KV cache."""

    EXPLICIT = "explicit"
    """``kv_cache_memory_bytes`` was set by the user: no lookup, no save."""
    APPLIED = "applied"
    """A plan was applied: memory profiling skipped, nothing saved."""
    PROFILING = "profiling"
    """vLLM profiles; the result is saved after warm-up."""


@dataclass
class Boot:
    """What this worker decided at lookup; the save reuses it."""

    mode: BootMode
    factors: WorkerFactors | None = None
    free_memory: object = None
    saved: bool = False


def safely(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """``fn(*args, **kwargs)``, or None with a warning if it raises: the boot goes on."""
    try:
        return fn(*args, **kwargs)
    except Exception:
        log.warning("plancache: %s failed; booting as usual", fn.__name__, exc_info=True)
        return None


def get_cache() -> PlanCache:
    """This process's cache, made from the environment on first use."""
    global _cache
    with _lock:
        if _cache is None:
            _cache = PlanCache.from_env()
        return _cache


def warm() -> None:
    """Open the store in the background while the worker loads its model, so that the
    lookup's time budget is spent on the request, not on importing a client library."""
    get_cache().warm()


def maybe_apply_startup_plan(worker: WorkerLike) -> Decision | None:
    """vLLM's ``maybe_apply_startup_plan`` on the configured store: if enabled and no
    explicit ``kv_cache_memory_bytes`` is set, set it from a plan that this worker's gate and
    every rank's accept. The decision, or None when nothing was looked up. Never raises."""
    return safely(apply_plan, worker) if enabled() else None


def maybe_save_startup_plan(worker: WorkerLike, kv_cache_memory_bytes: int) -> Recorded | None:
    """vLLM's ``maybe_save_startup_plan`` on the configured store: record
    ``kv_cache_memory_bytes`` under the key of this worker's lookup, only if enabled and this
    boot profiled, once per boot. The result, or None when nothing was stored. Never raises."""
    return safely(save_plan, worker, kv_cache_memory_bytes) if enabled() else None


def apply_plan(worker: WorkerLike) -> Decision | None:
    """Look up, agree across ranks, apply; once per worker. The decision, or None when
    nothing was looked up (decided before, or an explicit value). Raises what the worker
    raises."""
    if getattr(worker, STATE_ATTR, None) is not None:
        return None  # decided once per worker
    rank = getattr(worker, "rank", "?")
    explicit = worker.cache_config.kv_cache_memory_bytes
    if explicit is not None:
        setattr(worker, STATE_ATTR, Boot(BootMode.EXPLICIT))
        log.info(
            "plancache: rank %s: kv_cache_memory_bytes=%s set explicitly; no lookup, no save",
            rank,
            explicit,
        )
        return None
    decision, factors, free = _lookup(worker)
    can_apply = decision.kv_cache_memory_bytes is not None
    agreed, agreement = agree(can_apply)
    boot = Boot(BootMode.PROFILING, factors, free)
    fp = (decision.fingerprint or "-")[:12]
    if can_apply and agreed:
        kv = decision.kv_cache_memory_bytes
        worker.cache_config.kv_cache_memory_bytes = kv
        boot.mode = BootMode.APPLIED
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
    setattr(worker, STATE_ATTR, boot)
    return decision


def _key(worker: WorkerLike) -> tuple[WorkerFactors, object]:
    """(factors, free memory at boot start) of this worker; raises what the worker raises."""
    free: object = worker.init_snapshot.free_memory
    return worker_factors(worker), free


def _lookup(worker: WorkerLike) -> tuple[Decision, WorkerFactors | None, object]:
    """(decision, factors, free memory at boot); factor or config errors become an
    ``error`` decision, logged here because the cache never saw them."""
    start = time.perf_counter()
    try:
        factors, free = _key(worker)
        cache = get_cache()
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        log.warning("plancache: rank %s: no lookup: %s", getattr(worker, "rank", "?"), detail)
        return (
            Decision(None, Reason.ERROR, None, time.perf_counter() - start, None, detail),
            None,
            None,
        )
    return cache.lookup(as_scalars(factors), current_free_memory=free), factors, free


def save_plan(worker: WorkerLike, kv_cache_memory_bytes: object) -> Recorded | None:
    """Record ``kv_cache_memory_bytes`` under the key of this worker's lookup if this boot
    profiled and has not saved yet. The result, or None when nothing was stored."""
    rank = getattr(worker, "rank", "?")
    boot: Boot | None = getattr(worker, STATE_ATTR, None)
    if boot is None:  # a key computed now could differ from any lookup's (vLLM defect 4)
        log.info("plancache: rank %s: not saved: no lookup ran on this worker", rank)
        return None
    if boot.mode != BootMode.PROFILING or boot.saved or boot.factors is None:
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
        cache = get_cache()
    except ConfigError as exc:
        log.warning("plancache: rank %s: not saved: %s", rank, exc)
        return None
    return cache.record(
        as_scalars(boot.factors), kv_cache_memory_bytes=kv, free_memory_baseline=free
    )


def _as_int(value: object) -> int | None:
    """``value`` as an int if it is one (or an integral float); bool and others: None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
