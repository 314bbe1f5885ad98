"""vLLM's entry point: ``register()`` patches the GPU worker, now or when it is imported,
hooks vLLM's AOT compile cache (``compile``: compile artifacts shared through the store), the
other generated caches (``caches``) and its model-info cache (``modelinfo``), and routes
plancache's log lines through vLLM's logger."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading

from plancache._switches import compile_wanted, enabled

log = logging.getLogger("plancache.vllm")

_lock = threading.Lock()
_registered = False


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
            plans = enabled()
            if not (plans or compile_wanted()):
                return  # having imported little: vLLM loads this module in every process
            from plancache.integrations.vllm import caches, compile, modelinfo
            from plancache.integrations.vllm.patch import (
                TARGET_MODULE,
                patch_on_import,
                patch_worker_module,
            )

            artifacts = compile.wanted()
            _route_logs_to_vllm()
            if artifacts and _module_exists(compile.TARGET_MODULE):
                compile.hook()
                caches.hook()  # Triton's and FlashInfer's caches, the warm-up's additions
            if artifacts and _module_exists(modelinfo.TARGET_MODULE):
                modelinfo.hook()  # before the engine's config inspects the model
            if not plans:
                return
            module = sys.modules.get(TARGET_MODULE)
            if module is not None:
                patched = patch_worker_module(module)
            elif _module_exists(TARGET_MODULE):
                patch_on_import(TARGET_MODULE)
            else:
                log.warning("plancache: this vLLM has no %s; plugin inactive", TARGET_MODULE)
        except Exception:
            log.warning("plancache: vLLM plugin failed to register; inactive", exc_info=True)
    if patched:
        from plancache.integrations.vllm.apply import safely, warm

        safely(warm)


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
