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
imported, so processes that never import it (the API server) pay nothing. Its guarantees
are listed once, in the documentation (``docs/vllm.md``, "Guarantees").

Modules: ``registration`` (the entry point, logs; whether the plugin acts is
``plancache._switches``),
``patch`` (the import hook and the method wrappers), ``state`` (the process's plugin state,
one object), ``apply`` (lookup, crash marks, apply, the boot state), ``save`` (the save
after warm-up),
``factors`` (the plan key's factors), ``agreement`` (the rank agreement), ``worker`` (the
worker attributes read), ``compile`` (vLLM's torch.compile AOT artifacts, fetched from and
uploaded to the same store: see ``plancache._artifacts``).
Importing this package imports neither vLLM nor torch, and its names load on first use
(PEP 562): vLLM imports it in every process, and a process where the plugin is off loads
only ``registration`` and ``plancache._switches``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plancache._background import Job as BackgroundJob
    from plancache._breaker import Mark as CrashMark
    from plancache._breaker import Process as CrashMarkWriter
    from plancache._switches import enabled
    from plancache.integrations.vllm.apply import (
        Boot,
        BootMode,
        boot_of,
        maybe_apply_startup_plan,
        warmed_up,
    )
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

_LAZY = {
    **dict.fromkeys(
        ("Boot", "BootMode", "boot_of", "maybe_apply_startup_plan", "warmed_up"), "apply"
    ),
    "enabled": "plancache._switches",
    "BackgroundJob": "plancache._background:Job",
    "CrashMark": "plancache._breaker:Mark",
    "CrashMarkWriter": "plancache._breaker:Process",
    **dict.fromkeys(
        ("WorkerFactors", "device_factors", "software_factors", "worker_factors", "worker_labels"),
        "factors",
    ),
    **dict.fromkeys(
        ("BUILTIN_FUNCTIONS", "TARGET_MODULE", "WRAPPED_METHODS", "patch_worker_module"), "patch"
    ),
    "register": "registration",
    "maybe_save_startup_plan": "save",
    "wait_saved": "save",
    **dict.fromkeys(("MemoryFigures", "WorkerLike", "memory_figures"), "worker"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    path, _, attr = module.partition(":")  # "module:attr" where the names differ
    path = path if "." in path else f"{__name__}.{path}"
    value = getattr(importlib.import_module(path), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BUILTIN_FUNCTIONS",
    "TARGET_MODULE",
    "WRAPPED_METHODS",
    "BackgroundJob",
    "Boot",
    "BootMode",
    "CrashMark",
    "CrashMarkWriter",
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
