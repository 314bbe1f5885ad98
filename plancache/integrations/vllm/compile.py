"""Share vLLM's torch.compile AOT artifacts through the configured store.

``hook()`` (run by ``register``) wraps ``_try_load_aot_compiled_fn`` in
``vllm.compilation.decorators``, now or when that module is imported. vLLM calls it at a
``support_torch_compile`` model's first forward, with
``<VLLM_CACHE_ROOT>/torch_compile_cache/torch_aot_compile/<key>/rank_<r>_<dp>/model``,
whether or not a ``Worker`` is involved. The wrapper:

1. recovers the crash marks that dead boots left on this node for (key, rank): an artifact
   a boot died with (between its load and the end of the first forward) is avoided, its
   installed copy removed (vLLM compiles) and it is retracted from the store;
2. if ``model`` is missing locally, fetches the artifact of (key, rank) and installs it
   (``plancache._artifacts``: trusted and verified, atomically), and leaves a crash mark.
   Steps 1 and 2 start when the model is built (``_support_torch_compile`` is wrapped too:
   its classes compute the path as vLLM's first forward will, in a daemon thread:
   ``prefetch``), so the
   fetch overlaps the weights' loading; the first forward joins it (or, for a model built
   before the plugin registered, does them itself);
3. lets vLLM load as usual. If vLLM refused what was installed (it recompiles), that is
   logged with vLLM's reason; if it loaded, the mark is removed once the first forward
   returned.

It also wraps the model class's ``save_aot_compiled_function``: once vLLM saved a new
artifact and the first forward that follows returned, the artifact is uploaded in a daemon
thread (create-if-absent).

What vLLM adds to ``<key>/inductor_cache/`` after it saved the artifact (the warm-up's
sizes, CUDA-graph capture, autotuning) is the ``inductor`` cache kind, scoped by vLLM's key:
fetched with the artifact (step 2, whenever ``model`` is missing) and uploaded by
``upload_additions`` once the boot is ready (``caches.ready``), as a delta: only the files
that neither the stored artifact nor a stored bundle holds.

At exit, uploads in flight get ``PLANCACHE_COMPILE_EXIT_WAIT`` seconds in all (default 30),
then are abandoned (nothing is stored). Nothing here raises
into vLLM: any failure is logged and the node compiles as if plancache were absent.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from plancache import _background as background
from plancache import _metrics as metrics
from plancache._artifacts.archive import TEMP_PREFIX, installed_manifest
from plancache._artifacts.compiled import ARTIFACT_MARKS_DIR, artifact_id, as_observation
from plancache._artifacts.engine import CompileSettings, Fetched, Uploads
from plancache._artifacts.manifest import INDUCTOR_DIR, Manifest, check_key, check_rank
from plancache._artifacts.store import ArtifactStore
from plancache._breaker import Breaker, Mark
from plancache._observation import Observation
from plancache.integrations.vllm.apply import safely
from plancache.integrations.vllm.compile_miss import FACTORS_LABEL, name_miss_later
from plancache.integrations.vllm.compiling import PREFETCH_ATTR, aot_factors
from plancache.integrations.vllm.prefetch import MARK, Prefetch, wrap_decorator
from plancache.integrations.vllm.state import Plugin, current

log = logging.getLogger("plancache.vllm")

TARGET_MODULE = "vllm.compilation.decorators"
LOADER = "_try_load_aot_compiled_fn"
DECORATOR = "_support_torch_compile"

uploads = Uploads()
"""This process's background uploads (``uploads.wait(seconds)`` joins them)."""


def wanted() -> bool:
    """True if compile artifacts are shared in this process (``PLANCACHE_COMPILE_CACHE``,
    else whether the plugin is enabled). A malformed setting: warning, off."""
    return settings().enabled


def settings() -> CompileSettings:
    plugin = current()
    with plugin.compile_lock:
        if plugin.compile_settings is None:
            try:
                plugin.compile_settings = CompileSettings.from_env()
            except ValueError as exc:
                log.warning("plancache: compile artifacts not shared: %s", exc)
                plugin.compile_settings = CompileSettings(enabled=False)
        return plugin.compile_settings


def hook() -> None:
    """Wrap vLLM's AOT loader now, or when its module is imported (processes that never
    import it, such as the API server, pay nothing more)."""
    from plancache.integrations.vllm.patch import patch_when_imported

    patch_when_imported(TARGET_MODULE, patch_decorators)


def _start_opening() -> None:
    """Open the store in a daemon thread (once), and bound the uploads at exit."""
    plugin = current()
    with plugin.compile_lock:
        if plugin.opening is None:
            opener = functools.partial(_open, plugin)
            plugin.opening = background.start(opener, "plancache-compile-open")
            atexit.register(_at_exit)


def _open(plugin: Plugin) -> None:
    from plancache._config import Settings

    try:
        store = ArtifactStore(Settings.from_env(), settings())
    except Exception as exc:
        log.warning("plancache: compile artifacts not shared: %s: %s", type(exc).__name__, exc)
        return
    plugin.artifacts = store


def opened() -> ArtifactStore | None:
    """The artifact store, its opening started now if need be (see ``store``)."""
    _start_opening()
    return store()


def store(deadline: float | None = None) -> ArtifactStore | None:
    """The artifact store, once opened (waits for the opening until ``deadline``,
    monotonic; default: the fetch bound from now)."""
    plugin = current()
    if plugin.opening is not None:
        limit = settings().fetch_timeout if deadline is None else deadline - time.monotonic()
        plugin.opening.join(max(0.0, limit))
    return plugin.artifacts


def breaker() -> Breaker:
    from plancache._config import Settings

    return Breaker(Path(Settings.from_env().local_dir) / ARTIFACT_MARKS_DIR)


def patch_decorators(module: ModuleType) -> bool:
    """Wrap ``module``'s AOT loader (once); False, with a warning, if it has none."""
    from plancache.integrations.vllm.patch import unrecognised

    original: Any = getattr(module, LOADER, None)
    if getattr(original, MARK, False):
        return True
    decorate = getattr(module, DECORATOR, None)
    targets: dict[str, tuple[object, tuple[str, ...]]] = {
        LOADER: (original, ("model", "aot_compilation_path"))
    }
    if decorate is not None:  # without it, the fetch starts at the first forward
        targets[DECORATOR] = (decorate, ("cls",))
    off = unrecognised(targets)
    if off is not None:
        log.warning("plancache: %s: %s; compile artifacts not shared", TARGET_MODULE, off)
        return False
    setattr(module, LOADER, _wrap_loader(original, logging.getLogger(module.__name__)))
    if decorate is not None:
        setattr(module, DECORATOR, wrap_decorator(decorate, _start_prefetch))
    _start_opening()  # importing a client library takes a while: before the first forward
    return True


# -- the loader --------------------------------------------------------------------------------
@dataclass
class _Load:
    """One load attempt of (key, rank): what plancache installed for it, and its mark."""

    root: Path
    key: str
    rank: str
    manifest: Manifest | None = None
    mark: Mark | None = None


def _wrap_loader(original: Callable[..., Any], vllm_log: logging.Logger) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(model: Any, aot_compilation_path: str, *args: Any, **kwargs: Any) -> Any:
        attempt = safely(_before_load, model, aot_compilation_path)
        capture = _Capture()
        vllm_log.addHandler(capture)
        try:
            loaded = original(model, aot_compilation_path, *args, **kwargs)
        finally:
            vllm_log.removeHandler(capture)
        if attempt is None or attempt.manifest is None:
            return loaded
        return safely(_after_load, attempt, loaded, capture.messages) or loaded

    setattr(load, MARK, True)
    return load


class _Capture(logging.Handler):
    """Keeps the warnings vLLM logs while it loads (its reason for refusing an artifact)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _before_load(model: Any, path: str) -> _Load | None:
    if not settings().enabled:
        return None
    rank_dir = Path(path).parent
    attempt = _Load(rank_dir.parent, check_key(rank_dir.parent.name), check_rank(rank_dir.name))
    plugin = current()
    with plugin.compile_lock:
        plugin.used.setdefault(attempt.root, set()).add(attempt.rank)
    object.__setattr__(model, STARTED_ATTR, time.monotonic())  # a compile's cost, if it compiles
    _wrap_save(type(model))
    prefetch = getattr(model, PREFETCH_ATTR, None)
    where = None
    if isinstance(prefetch, Prefetch):  # started when the model was built: overlapped loading
        where = prefetch.join()
        if not prefetch.job.done():
            return attempt  # the fetch bound is spent: vLLM compiles
    if isinstance(prefetch, Prefetch) and where == (attempt.root, attempt.rank):
        fetched = prefetch.fetched
    else:  # built before the plugin registered, or vLLM's path differs from the one computed
        fetched = _prepare(attempt.root, attempt.key, attempt.rank)
    if fetched is not None and fetched.reason == "miss":  # named while vLLM compiles
        safely(name_miss_later, store, attempt.key, attempt.rank, model, _labels(model)["model"])
    if fetched is not None and fetched.reason == "hit" and fetched.manifest is not None:
        attempt.manifest = fetched.manifest
        aid = artifact_id(attempt.key, attempt.rank)
        attempt.mark = breaker().arm(aid, as_observation(fetched.manifest))
    return attempt


def _prepare(
    root: Path,
    key: str,
    rank: str,
    prefetched: bool = False,
    deadline: float | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    streaming: threading.Event | None = None,
) -> Fetched | None:
    """Recover this node's crash marks of (key, rank) (an avoided copy is removed), then
    fetch and install the artifact if ``rank/model`` is missing, the store's opening and the
    fetch together until ``deadline`` (monotonic; default: the fetch bound from now), and
    nothing once ``cancelled()``. None when there is nothing to fetch (vLLM's own copy
    serves) or no store."""
    deadline = time.monotonic() + settings().fetch_timeout if deadline is None else deadline
    artifacts = store(deadline)
    if artifacts is None:
        return None
    aid = artifact_id(key, rank)
    avoid = breaker().recover(_Retractor(artifacts, key, rank), aid)
    rank_dir = root / rank
    if (rank_dir / "model").exists():
        installed = installed_manifest(rank_dir)
        if installed is None or as_observation(installed).digest not in avoid:
            return None  # vLLM's own cache (or what an earlier boot installed) serves
        log.warning(
            "plancache: gate:crashed-before: compile artifact %s/%s: a boot on this node "
            "died with it; removing it, vLLM compiles",
            key[:12],
            rank,
        )
        _remove(rank_dir)
    fetched = artifacts.fetch(
        root, key, rank, avoid, deadline=deadline, cancelled=cancelled, streaming=streaming
    )
    log.info(
        "plancache: compile artifact %s/%s: %s%s (%.3f s%s)",
        key[:12],
        rank,
        fetched.reason,
        f" from {fetched.source}" if fetched.source else "",
        fetched.seconds,
        ", while the model loaded" if prefetched else "",
    )
    additions = artifacts.fetch_cache("inductor", key, root / INDUCTOR_DIR)
    plugin = current()
    with plugin.compile_lock:
        plugin.additions_known.setdefault(root, set()).update(additions.known)
    if additions.bundles or additions.reason != "miss":
        log.info(
            "plancache: compile artifact %s: warm-up additions: %s, %d bundles, %d files "
            "installed (%.3f s)",
            key[:12],
            additions.reason,
            additions.bundles,
            additions.installed,
            additions.seconds,
        )
    return fetched


def upload_additions(artifacts: ArtifactStore) -> None:
    """Store what this process's boot added to each ``<key>/inductor_cache/`` it used (a
    delta on the stored artifact and bundles: see the module docstring). Never raises."""
    plugin = current()
    with plugin.compile_lock:
        used = {root: set(ranks) for root, ranks in plugin.used.items()}
    for root, ranks in used.items():
        try:
            key = check_key(root.name)
            with plugin.compile_lock:
                known = set(plugin.additions_known.get(root, ()))
            for rank in ranks:  # the files of the artifact others install
                stored = artifacts.stored_manifest(key, rank)
                for entry in stored.files if stored is not None else ():
                    if entry.path.startswith(f"{INDUCTOR_DIR}/"):
                        known.add(entry.path[len(INDUCTOR_DIR) + 1 :])
            files, outcome = artifacts.upload_cache(
                "inductor", key, root / INDUCTOR_DIR, frozenset(known), producer()
            )
        except Exception as exc:
            log.warning(
                "plancache: compile artifact %s: additions not stored: %s", root.name[:12], exc
            )
            continue
        if files:
            log.info(
                "plancache: compile artifact %s: warm-up additions (%d files) stored: %s",
                key[:12],
                files,
                ", ".join(f"{k}={'created' if v else 'kept'}" for k, v in outcome.items())
                or "nowhere",
            )


STARTED_ATTR = "_plancache_first_forward_started"
"""When the first forward reached vLLM's AOT loader (monotonic): a compile's cost runs from
there to the save."""


def _start_prefetch(model: Any) -> None:
    """Start ``model``'s prefetch (``Prefetch``: ``_prepare`` in a daemon thread, within the
    fetch bound) where compile artifacts are shared and vLLM compiles it."""
    if settings().enabled and not getattr(model, "do_not_compile", True):
        prefetch = safely(Prefetch, model, _prepare, settings().fetch_timeout)
        if prefetch is not None:
            object.__setattr__(model, PREFETCH_ATTR, prefetch)


def _after_load(attempt: _Load, loaded: Any, warnings: list[str]) -> Any:
    if loaded is None:
        breaker().disarm(attempt.mark)  # refused, not crashed: vLLM compiles
        metrics.rebuilt("compile_artifact", 1)  # built anyway, named below
        reason = "; ".join(warnings) or "no reason logged"
        log.warning(
            "plancache: vLLM refused the installed compile artifact %s/%s and compiles: %s",
            attempt.key[:12],
            attempt.rank,
            reason,
        )
        return None
    mark = attempt.mark
    return _FirstCall(loaded, lambda: breaker().disarm(mark))


class _FirstCall:
    """Calls ``fn``; after its first call returned, runs ``then`` once (never raising).
    Everything else is ``fn``'s."""

    def __init__(self, fn: Any, then: Callable[[], object]) -> None:
        self._fn = fn
        self._then: Callable[[], object] | None = then

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._fn(*args, **kwargs)
        then, self._then = self._then, None
        if then is not None:
            safely(then)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


def _remove(rank_dir: Path) -> None:
    """Take ``rank_dir`` out of vLLM's sight at once (a rename), then delete it."""
    aside = rank_dir.parent / f"{TEMP_PREFIX}removed-{os.getpid()}-{time.time_ns()}"
    os.rename(rank_dir, aside)
    shutil.rmtree(aside, ignore_errors=True)


class _Retractor:
    """What the breaker retracts through: deletes the stored artifact a boot died with
    (only that one: by its manifest digest), in a daemon thread."""

    def __init__(self, artifacts: ArtifactStore, key: str, rank: str) -> None:
        self.artifacts, self.key, self.rank = artifacts, key, rank

    def retract(self, fingerprint: str, observation: Observation) -> object:
        digest = str(observation.producer.get("digest", ""))
        # waited for at exit like an upload
        return uploads.start(
            "a compile artifact's retraction", self.artifacts.retract, self.key, self.rank, digest
        )


# -- the upload --------------------------------------------------------------------------------
def _wrap_save(cls: type) -> None:
    original = getattr(cls, "save_aot_compiled_function", None)
    if not callable(original) or getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def save_aot_compiled_function(self: Any) -> None:
        original(self)
        safely(_after_save, self)

    setattr(save_aot_compiled_function, MARK, True)
    cls.save_aot_compiled_function = save_aot_compiled_function  # type: ignore[attr-defined]


def _after_save(model: Any) -> None:
    """Upload once the first forward with the new artifact returned (its kernels are then
    on disk)."""
    path = getattr(model, "_aot_compilation_path", None)
    if not path or getattr(model, "was_aot_compile_fn_loaded_from_disk", False):
        return
    if not os.path.exists(path) or settings().enabled is False:
        return
    rank_dir = Path(path).parent
    key, rank = check_key(rank_dir.parent.name), check_rank(rank_dir.name)
    labels = _labels(model)  # and what its key is made of, for the misses of other nodes
    labels[FACTORS_LABEL] = safely(aot_factors, model)
    started = getattr(model, STARTED_ATTR, None)
    made = producer()
    if isinstance(started, float):  # what the fetcher must beat (its pace is judged by it)
        made["compile_s"] = round(time.monotonic() - started, 3)
    fn = model.aot_compiled_fn
    model.aot_compiled_fn = _FirstCall(
        fn,
        lambda: uploads.start(
            "compile artifacts", _upload, rank_dir.parent, key, rank, labels, made
        ),
    )


def _labels(model: Any) -> dict[str, object]:  # ``_after_save`` adds the factors
    config = getattr(getattr(model, "vllm_config", None), "model_config", None)
    labels: dict[str, object] = {
        "model": str(getattr(config, "model", "")),
        "class": type(model).__name__,
    }
    return labels


def _upload(
    root: Path, key: str, rank: str, labels: dict[str, object], made: dict[str, object]
) -> None:
    artifacts = store()
    if artifacts is None:
        return
    start = time.monotonic()
    try:
        outcome = artifacts.upload(root, key, rank, labels, made)
    except Exception as exc:
        log.warning(
            "plancache: compile artifact %s/%s not stored: %s: %s",
            key[:12],
            rank,
            type(exc).__name__,
            exc,
        )
        return
    log.info(
        "plancache: compile artifact %s/%s stored: %s (%.3f s)",
        key[:12],
        rank,
        ", ".join(f"{k}={'created' if v else 'kept'}" for k, v in outcome.items()) or "nowhere",
        time.monotonic() - start,
    )


def producer() -> dict[str, object]:
    """Who made an artifact or bundle: host, vLLM's and torch's versions."""
    import torch
    from vllm import __version__

    return {"host": socket.gethostname(), "vllm": __version__, "torch": torch.__version__}


def _at_exit() -> None:
    bound = settings().exit_wait
    if not uploads.wait(bound):
        log.warning(
            "plancache: uploads still running after %.0f s (PLANCACHE_COMPILE_EXIT_WAIT), "
            "abandoned, nothing of them stored: %s",
            bound,
            ", ".join(uploads.unfinished()) or "none (they ended just now)",
        )
