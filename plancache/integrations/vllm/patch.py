"""The import hook and the patch: wrap ``Worker``'s methods in ``TARGET_MODULE`` as soon
as that module is executed, so processes that never import it (the API server) pay nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from plancache.integrations.vllm import apply, save
from plancache.integrations.vllm.apply import safely, warm
from plancache.integrations.vllm.compiling import compile_count
from plancache.integrations.vllm.worker import WorkerLike

log = logging.getLogger("plancache.vllm")

TARGET_MODULE = "vllm.v1.worker.gpu_worker"
"""The module whose ``Worker`` class is wrapped."""
REQUIRED_METHODS = ("determine_available_memory", "compile_or_warm_up_model")
WRAPPED_METHODS = ("load_model", *REQUIRED_METHODS)
"""``load_model`` (key, crash recovery, fetch), ``determine_available_memory`` (decision,
crash mark), ``compile_or_warm_up_model`` (mark removed, save)."""
BUILTIN_FUNCTIONS = ("maybe_apply_startup_plan", "maybe_save_startup_plan")
"""vLLM's built-in startup-plan functions, replaced in ``TARGET_MODULE`` by delegates."""
MARK = "__plancache_wrapped__"
"""Set to True on each wrapper."""


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def unrecognised(targets: Mapping[str, tuple[object, tuple[str, ...]]]) -> str | None:
    """What is off in vLLM's internals, or None: ``targets`` maps a name to the object found
    under it (None where absent) and the positional parameters the plugin's wrapper binds,
    in order. A target that is missing, not callable, or whose first parameters differ (a
    vLLM of another version) is named, with the parameters it has."""
    off = []
    for name, (fn, expected) in targets.items():
        if not callable(fn):
            off.append(f"{name} is missing")
            continue
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            off.append(f"{name} has a signature that cannot be read")
            continue
        first = params[: len(expected)]
        if tuple(p.name for p in first) != expected or any(
            p.kind not in _POSITIONAL for p in first
        ):
            have = ", ".join(p.name for p in params)
            off.append(f"{name} takes ({have}), not ({', '.join(expected)}, ...)")
    return "; ".join(off) or None


def patch_worker_module(module: ModuleType) -> bool:
    """Wrap ``module.Worker``'s methods and replace the module's built-in startup-plan
    functions by delegates that run them only for workers plancache cannot serve. True if
    patched (now or before); False, with one warning, if the class or a required method is
    missing (nothing is changed then). ``load_model`` is wrapped where it exists; without
    it the key is computed and the store read at ``determine_available_memory``."""
    worker_cls: Any = getattr(module, "Worker", None)
    targets: dict[str, tuple[object, tuple[str, ...]]] = {
        f"Worker.{m}": (getattr(worker_cls, m, None), ("self",)) for m in REQUIRED_METHODS
    }
    if callable(getattr(worker_cls, "load_model", None)):
        targets["Worker.load_model"] = (worker_cls.load_model, ("self",))
    off = "the class Worker is missing" if worker_cls is None else unrecognised(targets)
    if off is not None:
        log.warning("plancache: %s: %s; vLLM plugin inactive", module.__name__, off)
        return False
    if getattr(worker_cls.determine_available_memory, MARK, False):
        return True
    if callable(getattr(worker_cls, "load_model", None)):
        worker_cls.load_model = _wrap_load(worker_cls.load_model)
    worker_cls.determine_available_memory = _wrap_determine(worker_cls.determine_available_memory)
    worker_cls.compile_or_warm_up_model = _wrap_warmup(worker_cls.compile_or_warm_up_model)
    for name in BUILTIN_FUNCTIONS:
        original = getattr(module, name, None)
        if callable(original):
            apply.builtins.setdefault(name, original)
            setattr(module, name, _builtin_delegate(name, original))
    log.debug("plancache: patched %s.Worker", module.__name__)
    return True


def _wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_model(self: WorkerLike, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        boot = safely(apply.begin, self)
        if boot is not None:
            boot.costs["load_model"] = time.perf_counter() - start
        return original(self, *args, **kwargs)

    setattr(load_model, MARK, True)
    return load_model


def _wrap_determine(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def determine_available_memory(self: WorkerLike, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        apply.decide(self)  # raises only if the ranks could not vote: the boot stops
        boot = apply.boot_of(self)
        if boot is not None:
            boot.costs["determine_available_memory"] = time.perf_counter() - start
        before = safely(compile_count)
        result = original(self, *args, **kwargs)
        after = None if before is None else safely(compile_count)
        if boot is not None and before is not None and after is not None:
            boot.compiled = after > before  # its profile counted compile temporaries
        return result

    setattr(determine_available_memory, MARK, True)
    return determine_available_memory


def _wrap_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_or_warm_up_model(self: WorkerLike, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        start = time.perf_counter()
        safely(apply.warmed_up, self)  # the plan fitted: remove its crash mark
        safely(save.start_save, self, getattr(self, "available_kv_cache_memory_bytes", None))
        boot = apply.boot_of(self)
        if boot is not None:
            boot.costs["compile_or_warm_up_model"] = time.perf_counter() - start
        return result

    setattr(compile_or_warm_up_model, MARK, True)
    return compile_or_warm_up_model


def _builtin_delegate(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """Stands in for vLLM's built-in ``name``: plancache does its job for the workers it
    serves; the built-in still runs for a worker whose key plancache could not compute."""

    @functools.wraps(original)
    def delegate(worker: object, *args: Any, **kwargs: Any) -> Any:
        boot = apply.boot_of(worker)
        if boot is None:
            return original(worker, *args, **kwargs)  # never decided by plancache
        if boot.builtin and name == "maybe_save_startup_plan":
            return original(worker, *args, **kwargs)
        return None  # plancache's (or, for apply, already run by plancache's decision)

    setattr(delegate, MARK, True)
    return delegate


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``target`` (default ``TARGET_MODULE``) through the other finders and patches it
    once executed (each of ``callbacks``, in order; ``on_load`` None: the worker patch);
    removes itself from ``sys.meta_path`` then."""

    def __init__(
        self,
        target: str = TARGET_MODULE,
        on_load: Callable[[ModuleType], object] | None = None,
    ) -> None:
        self.target = target
        self.callbacks: list[Callable[[ModuleType], object]] = [on_load or _patch_and_warm]

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, PatchOnImport) or not hasattr(finder, "find_spec"):
                continue  # another of these would ask this one back: endless recursion
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if isinstance(spec.loader, importlib.abc.Loader) and hasattr(
                spec.loader, "exec_module"
            ):
                spec.loader = _PatchingLoader(spec.loader, self)
            return spec
        return None


def patch_on_import(target: str, on_load: Callable[[ModuleType], object] | None = None) -> None:
    """Put a ``PatchOnImport(target, on_load)`` first in ``sys.meta_path``; where one for
    ``target`` is there already, add ``on_load`` to it (each callback once)."""
    callback = on_load or _patch_and_warm
    for finder in sys.meta_path:
        if isinstance(finder, PatchOnImport) and finder.target == target:
            if callback not in finder.callbacks:
                finder.callbacks.append(callback)
            return
    sys.meta_path.insert(0, PatchOnImport(target, on_load))


def _patch_and_warm(module: ModuleType) -> None:
    """The worker patch, then the plans' warm-up (where it patched)."""
    try:
        patched = patch_worker_module(module)
    except Exception:
        log.warning("plancache: could not patch %s; inactive", module.__name__, exc_info=True)
        return
    if patched:
        safely(warm)


def patch_when_imported(target: str, on_load: Callable[[ModuleType], object]) -> None:
    """``on_load(module)`` now if ``target`` is imported already, else when it is first
    imported (processes that never import it pay nothing more)."""
    module = sys.modules.get(target)
    if module is not None:
        on_load(module)
    else:
        patch_on_import(target, on_load)


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
        for callback in self.finder.callbacks:
            safely(callback, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
