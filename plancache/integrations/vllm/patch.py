"""The import hook and the patch: wrap ``Worker``'s two methods in ``TARGET_MODULE`` as soon
as that module is executed, so processes that never import it (the API server) pay nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from plancache.integrations.vllm.apply import apply_plan, safely, save_plan, warm
from plancache.integrations.vllm.worker import WorkerLike

log = logging.getLogger("plancache.vllm")

TARGET_MODULE = "vllm.v1.worker.gpu_worker"
"""The module whose ``Worker`` class is wrapped."""
WRAPPED_METHODS = ("determine_available_memory", "compile_or_warm_up_model")
BUILTIN_FUNCTIONS = ("maybe_apply_startup_plan", "maybe_save_startup_plan")
"""vLLM's built-in startup-plan functions, replaced in ``TARGET_MODULE`` by no-ops."""
MARK = "__plancache_wrapped__"
"""Set to True on each wrapper."""


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
    if getattr(worker_cls.determine_available_memory, MARK, False):
        return True
    worker_cls.determine_available_memory = _wrap_determine(worker_cls.determine_available_memory)
    worker_cls.compile_or_warm_up_model = _wrap_warmup(worker_cls.compile_or_warm_up_model)
    for name in BUILTIN_FUNCTIONS:
        if hasattr(module, name):
            setattr(module, name, builtin_replaced)
    log.debug("plancache: patched %s.Worker", module.__name__)
    return True


def _wrap_determine(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def determine_available_memory(self: WorkerLike, *args: Any, **kwargs: Any) -> Any:
        safely(apply_plan, self)
        return original(self, *args, **kwargs)

    setattr(determine_available_memory, MARK, True)
    return determine_available_memory


def _wrap_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_or_warm_up_model(self: WorkerLike, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        safely(save_plan, self, getattr(self, "available_kv_cache_memory_bytes", None))
        return result

    setattr(compile_or_warm_up_model, MARK, True)
    return compile_or_warm_up_model


def builtin_replaced(*args: object, **kwargs: object) -> None:
    """Stands in for vLLM's built-in startup-plan functions: plancache does their job."""


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``TARGET_MODULE`` through the other finders and patches it once executed;
    removes itself from ``sys.meta_path`` then."""

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
    def __init__(self, inner: importlib.abc.Loader, finder: PatchOnImport) -> None:
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
            safely(warm)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
