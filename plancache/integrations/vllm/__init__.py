"""vLLM general plugin: skip KV-cache memory profiling at boot with a plan from any store.

Registered under the entry-point group ``vllm.general_plugins`` as ``plancache``; vLLM calls
:func:`register` once per process (API server, engine core, each worker). It does nothing
unless enabled: ``PLANCACHE_URL`` set, ``PLANCACHE_ENABLE=1``, or vLLM's own
``VLLM_ENABLE_STARTUP_PLAN=1`` (then plancache replaces vLLM's built-in startup plan, which
neither applies nor saves anything). ``PLANCACHE_ENABLE=0`` turns it off whatever else is set.

When enabled, it wraps ``vllm.v1.worker.gpu_worker.Worker``'s ``load_model`` (compute the
key, recover the crash marks dead boots left on this node, start the store fetch in a daemon
thread: the fetch overlaps weight loading), ``determine_available_memory`` (join the fetch,
gate, write a crash mark, agree across ranks, apply) and ``compile_or_warm_up_model``
(remove the mark, save in a daemon thread after it returned), as soon as that module is
imported, so processes that never import it (the API server) pay nothing. Guarantees:

- an explicit ``--kv-cache-memory-bytes`` is always respected: no lookup, no save;
- the key is computed once, when ``load_model`` is entered, and the save uses the same
  factors, however the config changes later in startup;
- every rank of vLLM's world group (every DP engine too) votes exactly once, at
  ``determine_available_memory``; a plan is applied only if no rank must profile; if the
  vote itself fails, the boot stops with ``RankAgreementError`` (never ranks on different
  paths);
- a plan's observation is applied only if its KV cache fits in what the boot may use
  (``requested_memory`` minus the loaded weights: ``gate:exceeds-budget``), no earlier boot
  on this node died with it, and its crash mark is written; a boot that finds the mark of a
  dead process avoids that observation (``gate:crashed-before``) and retracts it from the
  store, so a bad plan costs each node at most one failed boot;
- a plan is saved only by a boot that profiled, after ``compile_or_warm_up_model``
  returned, and it records what that boot allocated (``available_kv_cache_memory_bytes``);
  the save never delays readiness or exit;
- device facts come from ``vllm.platforms.current_platform`` (CUDA, ROCm, XPU); where the
  key cannot be computed, vLLM's built-in startup-plan functions act as without plancache;
- a setting plancache cannot use (e.g. a key variable that holds no key, a key file that is
  no regular file) turns it off for the process with one ERROR line: its boots profile and
  record nothing, and vLLM's built-in functions do not act either;
- nothing here raises into vLLM's boot path because of a store, a config or a missing
  attribute; a vLLM without the wrapped methods gets one warning and no patch.

Modules: ``enable`` (whether the plugin acts), ``registration`` (the entry point, logs),
``patch`` (the import hook and the method wrappers), ``apply`` (lookup, crash marks, apply,
the boot state, the process's cache and breaker), ``save`` (the save after warm-up),
``factors`` (the plan key's factors), ``agreement`` (the rank agreement), ``worker`` (the
worker attributes read), ``compile`` (vLLM's torch.compile AOT artifacts, fetched from and
uploaded to the same store: see ``plancache.artifacts``).
Importing this package imports neither vLLM nor torch.
"""

from __future__ import annotations

from plancache.integrations.vllm.apply import (
    Boot,
    BootMode,
    boot_of,
    maybe_apply_startup_plan,
    warmed_up,
)
from plancache.integrations.vllm.enable import enabled
from plancache.integrations.vllm.factors import (
    WorkerFactors,
    device_factors,
    software_factors,
    worker_factors,
    worker_labels,
)
from plancache.integrations.vllm.patch import (
    BUILTIN_FUNCTIONS,
    TARGET_MODULE,
    WRAPPED_METHODS,
    patch_worker_module,
)
from plancache.integrations.vllm.registration import register
from plancache.integrations.vllm.save import maybe_save_startup_plan, wait_saved
from plancache.integrations.vllm.worker import MemoryFigures, WorkerLike, memory_figures

__all__ = [
    "BUILTIN_FUNCTIONS",
    "TARGET_MODULE",
    "WRAPPED_METHODS",
    "Boot",
    "BootMode",
    "MemoryFigures",
    "WorkerFactors",
    "WorkerLike",
    "boot_of",
    "device_factors",
    "enabled",
    "maybe_apply_startup_plan",
    "maybe_save_startup_plan",
    "memory_figures",
    "patch_worker_module",
    "register",
    "software_factors",
    "wait_saved",
    "warmed_up",
    "worker_factors",
    "worker_labels",
]
