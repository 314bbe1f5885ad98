"""The save: a boot that profiled records what it allocated under the key its lookup used,
once, after ``compile_or_warm_up_model`` returned, in a daemon thread that never delays
readiness or exit; the background retractions this boot started go to the store first.

Guarantees: only a boot whose mode is ``BootMode.PROFILING`` saves, at most once; the
factors and free memory are those ``load_model`` read (``apply.begin``), however the config
changed later in startup; a worker no lookup ran on saves nothing (a key computed now could
differ from any lookup's); values that are not sizes are logged and not saved; a boot whose
profile run compiled (``Boot.compiled``) records a provisional observation (docs/vllm.md,
"A compiling boot's plan is provisional").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from plancache import _background as background
from plancache._background import Job
from plancache._cache import Recorded
from plancache._switches import enabled
from plancache.integrations.vllm.apply import BootMode, boot_of, get_cache, safely
from plancache.integrations.vllm.factors import as_scalars
from plancache.integrations.vllm.worker import WorkerLike

log = logging.getLogger("plancache.vllm")


def maybe_save_startup_plan(worker: WorkerLike, kv_cache_memory_bytes: int) -> Recorded | None:
    """vLLM's ``maybe_save_startup_plan`` on the configured store: record
    ``kv_cache_memory_bytes`` under the key of this worker's lookup, only if enabled and this
    boot profiled, once per boot, in this thread. The result, or None when nothing was
    stored. Never raises."""
    return safely(save_plan, worker, kv_cache_memory_bytes) if enabled() else None


def _save_job(worker: WorkerLike, kv_cache_memory_bytes: object) -> Callable[[], Recorded] | None:
    """The record this boot owes (once: it is marked saved here), or None when it owes none:
    not a profiled boot, saved before, or values that are not sizes."""
    rank = getattr(worker, "rank", "?")
    boot = boot_of(worker)
    if boot is None:  # a key computed now could differ from any lookup's (vLLM defect 4)
        log.info("plancache: rank %s: not saved: no lookup ran on this worker", rank)
        return None
    if boot.mode is not BootMode.PROFILING or boot.saved or boot.factors is None:
        return None
    kv, free = _as_int(kv_cache_memory_bytes), _as_int(boot.free_memory)
    if kv is None or free is None:
        log.warning(
            "plancache: rank %s: not saved: KV-cache size %r, free memory at boot %r",
            rank,
            kv_cache_memory_bytes,
            boot.free_memory,
        )
        return None
    cache = get_cache()
    factors, labels = as_scalars(boot.factors), dict(boot.labels)
    provisional = boot.compiled is True  # compile temporaries counted as activation memory
    retractions = list(boot.retractions)

    def record() -> Recorded:
        for retraction in retractions:  # a crashed observation's tombstone goes first
            retraction.join(cache.timeout)
        boot.recorded = cache.record(
            factors,
            kv_cache_memory_bytes=kv,
            free_memory_baseline=free,
            labels=labels,
            provisional=provisional,
        )
        return boot.recorded

    boot.saved = True
    return record


def save_plan(worker: WorkerLike, kv_cache_memory_bytes: object) -> Recorded | None:
    """Record ``kv_cache_memory_bytes`` under the key of this worker's lookup in this thread
    (bounded by the budget) if this boot profiled and has not saved yet."""
    job = _save_job(worker, kv_cache_memory_bytes)
    return None if job is None else job()


def start_save(worker: WorkerLike, kv_cache_memory_bytes: object) -> Job[Recorded | None] | None:
    """Like ``save_plan``, on a daemon thread (``background.start``): the caller never waits
    for the store, and the process never waits for it at exit. The job, or None when nothing
    is owed."""
    job = _save_job(worker, kv_cache_memory_bytes)
    if job is None:
        return None
    boot = boot_of(worker)
    assert boot is not None
    boot.saving = background.start(lambda: safely(job), "plancache-save")
    return boot.saving


def wait_saved(worker: object, timeout: float) -> Recorded | None:
    """Wait at most ``timeout`` seconds in all for ``worker``'s background store writes (the
    retractions started at ``load_model``, then the save); the save's result, or None
    (nothing saved, or not finished). For tools and tests: vLLM never waits."""
    boot = boot_of(worker)
    if boot is None:
        return None
    deadline = time.monotonic() + timeout
    for retraction in boot.retractions:
        retraction.join(deadline - time.monotonic())
    if boot.saving is not None:
        boot.saving.join(deadline - time.monotonic())
    return boot.recorded


def _as_int(value: object) -> int | None:
    """``value`` as an int if it is one (or an integral float); bool and others: None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
