"""Share vLLM's model-info files (``VLLM_CACHE_ROOT/modelinfos/``) through the store.

``hook()`` (run by ``register`` where compile artifacts are shared) wraps two methods of
``vllm.model_executor.models.registry._LazyRegisteredModel``, now or when that module is
imported:

- ``_load_modelinfo_from_cache(module_hash)``: where vLLM finds no file for the model class
  (it would inspect the class in a fresh Python subprocess: 11-13 s of a boot here), the
  file of (vLLM's version, module, class, ``module_hash``) is fetched, verified, trusted as
  compile artifacts are, and installed atomically, never over a file the node has; then
  vLLM reads it as its own. The store's opening and the fetch together wait at most
  ``PLANCACHE_TIMEOUT`` (the plans' budget), over any backend, then vLLM inspects as usual
  (``timeout``; the fetch left running installs nothing);
- built anyway: where vLLM still reads no file after one was installed (it inspects the
  class), one WARNING says so and ``plancache_rebuilt_total{kind="model_info"}`` counts it;
- ``_save_modelinfo_to_cache(mi, module_hash)``: once vLLM wrote a file, it is uploaded in
  the background, create-if-absent (``compile.uploads``: bounded at exit).

Plugins load in ``EngineArgs.__post_init__``, before ``create_engine_config`` inspects the
model, so the first inspection of a boot already finds the file. A vLLM without those
methods (another version's internals) gets one warning and runs exactly as without
plancache. Nothing here raises into vLLM.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from plancache import _background as background
from plancache import _metrics as metrics
from plancache._artifacts import modelinfo
from plancache._artifacts.engine import Fetched
from plancache._defaults import TIMEOUT
from plancache.integrations.vllm import compile

log = logging.getLogger("plancache.vllm")

TARGET_MODULE = "vllm.model_executor.models.registry"
CLASS = "_LazyRegisteredModel"
LOAD, SAVE = "_load_modelinfo_from_cache", "_save_modelinfo_to_cache"
REQUIRED = (LOAD, SAVE, "_get_cache_dir", "_get_cache_filename")
MARK = "__plancache_wrapped__"


def hook() -> None:
    """Wrap the registry's model-info cache now, or when its module is imported."""
    from plancache.integrations.vllm.patch import patch_when_imported

    patch_when_imported(TARGET_MODULE, patch_registry)


def patch_registry(module: ModuleType) -> bool:
    """Wrap the two methods (once); False, with one warning, where they are not there."""
    from plancache.integrations.vllm.patch import unrecognised

    cls = getattr(module, CLASS, None)
    if getattr(getattr(cls, LOAD, None), MARK, False):
        return True
    binds = {  # what each is called with here (``_get_cache_dir`` is a staticmethod)
        LOAD: ("self", "module_hash"),
        SAVE: ("self", "mi", "module_hash"),
        "_get_cache_dir": (),
        "_get_cache_filename": ("self",),
    }
    targets = {f"{CLASS}.{m}": (getattr(cls, m, None), binds[m]) for m in REQUIRED}
    off = f"{CLASS} is missing" if cls is None else unrecognised(targets)
    if off is not None:
        log.warning("plancache: %s: %s; model info is not shared", TARGET_MODULE, off)
        return False
    load, save = getattr(cls, LOAD), getattr(cls, SAVE)

    def load_modelinfo(self: Any, module_hash: str) -> Any:
        found = load(self, module_hash)
        if found is None and _fetch(self, module_hash):
            found = load(self, module_hash)
            if found is None:  # built anyway: vLLM inspects the class in a subprocess
                log.warning(
                    "plancache: model info %s.%s: installed, yet vLLM did not read it and "
                    "inspects the class (its reader or file format differs from the producer's)",
                    getattr(self, "module_name", "?"),
                    getattr(self, "class_name", "?"),
                )
                metrics.rebuilt("model_info", 1)
        return found

    def save_modelinfo(self: Any, mi: Any, module_hash: str) -> None:
        save(self, mi, module_hash)
        try:
            _upload(self, module_hash)
        except Exception as exc:  # never into vLLM
            log.warning("plancache: model info not uploaded: %s: %s", type(exc).__name__, exc)

    for wrapper in (load_modelinfo, save_modelinfo):
        setattr(wrapper, MARK, True)
    setattr(cls, LOAD, load_modelinfo)
    setattr(cls, SAVE, save_modelinfo)
    return True


def _where(model: Any) -> tuple[Path, str, str, str]:
    """(the file vLLM reads, vLLM's version, the model's module, its class)."""
    import vllm

    path = Path(model._get_cache_dir()) / model._get_cache_filename()
    return path, str(vllm.__version__), str(model.module_name), str(model.class_name)


def _fetch(model: Any, module_hash: str) -> bool:
    """True if a shared file was installed for ``model`` (within the plans' budget)."""
    try:
        path, version, module, cls = _where(model)
        name = modelinfo.model_info_object_name(version, module, cls, module_hash)

        budget = TIMEOUT.read()
        ends = time.monotonic() + budget

        def fetch() -> Fetched | None:  # the store's opening counts to the budget too
            artifacts = compile.opened()
            if artifacts is None:
                return None
            left = max(0.0, ends - time.monotonic())  # past it, it installs nothing
            return artifacts.fetch_model_info(name, module_hash, path, timeout=left)

        job = background.start(fetch, "plancache-modelinfo")
        if not job.join(budget):
            log.info("plancache: model info %s.%s: timeout (%.1f s)", module, cls, budget)
            return False
        fetched = job.wait(0)
        if fetched is None:
            return False
    except Exception as exc:  # never into vLLM: it inspects the class as usual
        log.warning("plancache: model info not fetched: %s: %s", type(exc).__name__, exc)
        return False
    log.info(
        "plancache: model info %s.%s: %s%s (%.3f s)",
        module,
        cls,
        fetched.reason,
        f" from {fetched.source}" if fetched.source else "",
        fetched.seconds,
    )
    return fetched.reason in ("hit", "present")


def _upload(model: Any, module_hash: str) -> None:
    """Upload the file vLLM just wrote for ``model`` in the background (the store's opening
    too: nothing of it on vLLM's path)."""
    path, version, module, cls = _where(model)
    file = modelinfo.read_file(path)
    if file is None or file.get("hash") != module_hash:
        return

    def upload() -> None:
        shared = compile.opened()
        if shared is not None:
            shared.upload_model_info(modelinfo.made(version, module, cls, file, shared.keyring))

    compile.uploads.start("model info", upload)
