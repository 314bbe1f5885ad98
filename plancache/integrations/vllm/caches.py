"""Share the generated caches a warm node reuses beyond the compile artifact, file by file.

Each is a cache kind on the object layer (``plancache._artifacts``: bundles of files whose
paths carry their own keys, trusted as compile artifacts are, since they are loaded as code
or trusted as fact), valid where the factors hashed into its scope hold:

- ``triton``: Triton's cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``), where
  vLLM's own Triton kernels land: one directory per kernel, named by Triton's key (source,
  options, target, Triton's version). Scope: Triton's version and the GPU (name, compute
  capability). Measured on a CPU machine with kernels compiled for a CUDA target.
- ``flashinfer_autotune``: vLLM's FlashInfer autotune files
  (``<VLLM_CACHE_ROOT>/flashinfer_autotune_cache/<flashinfer version>/<arch>/<config
  hash>/autotune_configs*.json``, written whole by vLLM: temp + rename). Scope: FlashInfer's
  version and workspace, the GPU. Built from vLLM 0.33's source and tested with such files;
  not measured (it needs a GPU with FlashInfer).
- ``inductor``: what the warm-up adds to a compile artifact (``compile``).

Fetch: ``start_fetch`` (when vLLM's compilation module is imported, in a daemon thread: it
overlaps the weights' loading, and waits for nothing) installs every trusted bundle of each
cache present here, each file create-if-absent (Triton's ``__grp__`` files last, so no kernel
is visible before its files are in place). A kernel Triton compiles meanwhile is simply
compiled, as without plancache.

Upload: ``ready`` (once ``Worker.compile_or_warm_up_model`` returned, so the warm-up's
kernels are included; a process without a ``Worker`` calls it itself) stores, in a daemon
thread after the uploads already running, each cache's files that no bundle read at the
fetch lists, as one bundle (a delta, named by its content: nodes that add the same files
write one object), and the compile artifacts' additions. Waited for at exit like every
upload (``PLANCACHE_COMPILE_EXIT_WAIT``). Before it, Triton kernels this boot compiled
although the fetch installed bundles (group files neither there at the fetch's start nor in
a bundle read) are reported (``triton.report_rebuilt``: one WARNING, the metric); after it,
this process's boot report is stored (``plancache._artifacts.reports``: what it decided
per kind and rebuilt anyway; none where it decided nothing). Nothing here raises into vLLM.

Left out, and why: DeepGEMM's JIT cache (its kernel directories are judged complete by
DeepGEMM's own C++ runtime, which is not in vLLM's source, so a file-by-file install could
not be proven never to expose half a kernel; its keys also bake in the install path),
FlashInfer's JIT cache (its directories are named by operation, not by a key of their
sources and toolkit, so another node's build could be loaded where it does not belong) and
the custom all-reduce P2P access cache (a fact about one host's PCIe/NVLink topology and
IOMMU settings that no factor computed without the GPUs captures: a wrong answer corrupts
all-reduce silently).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import time
from types import ModuleType
from typing import Any

from plancache import _background as background
from plancache import _metrics as metrics
from plancache._artifacts import reports
from plancache._artifacts.store import ArtifactStore
from plancache._background import Job
from plancache.caches import GeneratedCache, directory_cache, triton_cache
from plancache.integrations import triton
from plancache.integrations.vllm import compile
from plancache.integrations.vllm.apply import safely
from plancache.integrations.vllm.state import Plugin, current

log = logging.getLogger("plancache.vllm")

WORKER_MODULE = "vllm.v1.worker.gpu_worker"
READY = "compile_or_warm_up_model"
MARK = "__plancache_caches__"


def hook() -> None:
    """Start the fetch when vLLM's compilation module is imported (engine processes only),
    and the upload when a ``Worker``'s warm-up returned."""
    from plancache.integrations.vllm.patch import patch_when_imported

    patch_when_imported(compile.TARGET_MODULE, lambda module: start_fetch() or True)
    patch_when_imported(WORKER_MODULE, patch_worker)


def patch_worker(module: ModuleType) -> bool:
    """Wrap ``Worker.compile_or_warm_up_model`` (once) to call ``ready`` after it returned."""
    worker = getattr(module, "Worker", None)
    original = getattr(worker, READY, None)
    if worker is None or not callable(original):
        log.warning("plancache: %s has no Worker.%s: no cache uploaded", module.__name__, READY)
        return False
    if getattr(original, MARK, False):
        return True

    @functools.wraps(original)
    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        safely(ready)
        return out

    setattr(compile_or_warm_up_model, MARK, True)
    setattr(worker, READY, compile_or_warm_up_model)
    return True


def caches() -> list[GeneratedCache]:
    """The caches shared on this node: those whose library is installed here, described
    as any program describes them (``plancache.caches``: the same kinds and scopes, so
    that a Triton kernel bundled here serves the Triton cache manager too)."""
    out = []
    for make in (_triton, _flashinfer_autotune):
        try:
            cache = make()
        except Exception as exc:  # a library that cannot say where its cache is: not shared
            log.info("plancache: %s: not shared: %s: %s", make.__name__, type(exc).__name__, exc)
            continue
        if cache is not None:
            out.append(cache)
    return out


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device() -> str:
    """The GPU this process runs on, as vLLM's platform names it ("none" without one):
    ``"<name> sm_<major><minor>"`` as ``plancache.caches.device`` gives it, but read through
    NVML as vLLM reads it, so that no CUDA context is created from the fetch's thread."""
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    if capability is None:
        return "none"
    return f"{current_platform.get_device_name()} sm_{capability.to_int()}"


def _triton() -> GeneratedCache | None:
    if _version("triton") is None:
        return None
    return triton_cache(gpu=_device())


def _flashinfer_autotune() -> GeneratedCache | None:
    version = _version("flashinfer-python")
    if version is None:
        return None
    from vllm.model_executor.warmup.flashinfer_autotune_cache import flashinfer_autotune_root

    root = flashinfer_autotune_root()
    factors = {"flashinfer": version, "device": _device()}
    factors["workspace"] = f"{root.parent.name}/{root.name}"
    return directory_cache("flashinfer_autotune", root, factors)


def start_fetch() -> Job[None] | None:
    """Fetch every shared cache in a daemon thread (once per process); the job."""
    if not compile.settings().enabled:
        return None
    plugin = current()
    with plugin.caches_lock:
        if plugin.fetching is None:
            fetch = functools.partial(_fetch_all, plugin)
            plugin.fetching = background.start(fetch, "plancache-caches-fetch")
        return plugin.fetching


def _fetch_all(plugin: Plugin) -> None:
    artifacts = compile.opened()
    if artifacts is None:
        return
    for cache in caches():
        if cache.kind == "triton":
            there = frozenset(triton.compiled_since(cache.root, frozenset()))
            with plugin.caches_lock:
                plugin.before[cache] = there
        fetched = artifacts.fetch_cache(cache.kind, cache.scope, cache.root)
        with plugin.caches_lock:
            plugin.known.setdefault(cache, set()).update(fetched.known)
            plugin.bundles[cache] = plugin.bundles.get(cache, 0) + fetched.bundles
        log.info(
            "plancache: %s cache: %s, %d bundles, %d files installed (%.3f s)",
            cache.kind,
            fetched.reason,
            fetched.bundles,
            fetched.installed,
            fetched.seconds,
        )


def ready() -> Job[object] | None:
    """The boot is ready: upload, in a daemon thread, what it added to every shared cache
    (see the module docstring; once per process). The job, or None."""
    plugin = current()
    with plugin.caches_lock:
        if plugin.ready or not compile.settings().enabled:
            return None
        plugin.ready = True
    earlier = compile.uploads.running()
    return compile.uploads.start("the shared caches' bundles", _upload_all, plugin, earlier)


def _upload_all(plugin: Plugin, earlier: list[Job[object]]) -> None:
    deadline = time.monotonic() + compile.settings().exit_wait
    fetching = [plugin.fetching] if plugin.fetching is not None else []
    for job in earlier + fetching:
        job.join(max(0.0, deadline - time.monotonic()))  # the artifact first: its files are known
    artifacts = compile.store()
    if artifacts is None:
        return
    compile.upload_additions(artifacts)
    for cache in caches():
        _upload(plugin, artifacts, cache)
    tally = metrics.tally()
    if not tally:  # this process decided nothing: nothing to report
        return
    report = reports.made(tally, compile.producer(), artifacts.keyring)
    written = artifacts.upload_report(report)
    log.info("plancache: boot report %s: %s", report.name, written or "not written")


def _upload(plugin: Plugin, artifacts: ArtifactStore, cache: GeneratedCache) -> None:
    start = time.monotonic()
    with plugin.caches_lock:
        known = frozenset(plugin.known.get(cache, ()))
        bundles = plugin.bundles.get(cache, 0)
        before = plugin.before.get(cache, frozenset())
    if cache.kind == "triton":  # kernels this boot compiled although bundles were installed
        triton.report_rebuilt(triton.compiled_since(cache.root, known | before), bundles)
    try:
        files, outcome = artifacts.upload_cache(
            cache.kind, cache.scope, cache.root, known, compile.producer(), dict(cache.factors)
        )
    except Exception as exc:
        log.warning("plancache: %s cache not stored: %s: %s", cache.kind, type(exc).__name__, exc)
        return
    if files:
        log.info(
            "plancache: %s cache: %d new files stored: %s (%.3f s)",
            cache.kind,
            files,
            ", ".join(f"{k}={'created' if v else 'kept'}" for k, v in outcome.items()) or "nowhere",
            time.monotonic() - start,
        )
