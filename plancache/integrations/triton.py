"""A Triton cache manager that shares compiled kernels through plancache's stores (public).

Set ``TRITON_CACHE_MANAGER=plancache.integrations.triton:CacheManager`` (Triton's own plug-in
point: a ``module:Class`` that Triton instantiates for every kernel key; run with Triton
3.9.0 and 3.6.0, whose ``knobs.cache.manager_class`` reads it, and read in the source of the
releases before Triton's knobs, whose ``get_cache_manager`` reads it) and, as for every
kind, ``PLANCACHE_URL``.
``CacheManager`` *is* Triton's ``FileCacheManager`` (a subclass that changes none of its
reads or writes), plus:

- **pull**: the first kernel key a process looks up in a cache directory (Triton's
  ``TRITON_CACHE_DIR``, default ``~/.triton/cache``) first installs, once per process and
  directory, every trusted bundle of the ``triton`` kind in its scope (Triton's version and
  the GPU: ``plancache.caches.triton_cache``), each file create-if-absent, group files last
  and re-rooted (``CacheShare.pull``). Triton waits for it at most
  ``PLANCACHE_COMPILE_TIMEOUT`` seconds; past it, or on any failure (logged), Triton compiles
  what it lacks, as without plancache (a pull still running installs nothing over a file
  Triton wrote);
- **rebuilt anyway**: a kernel this process compiled (Triton stored its group file) after its
  pull installed bundles is counted; at the push, one WARNING names how many and which,
  with the likely causes, and ``plancache_rebuilt_total{kind="cache_triton"}`` counts them
  (``report_rebuilt``, which the vLLM plugin calls too);
- **push**: at the process's exit (``atexit``), the kernels this process compiled or used
  (their key directories) that no bundle it pulled holds are stored as one bundle
  (``CacheShare.push``), waited for at most ``PLANCACHE_COMPILE_EXIT_WAIT`` seconds, then
  abandoned (nothing stored). ``push()`` does the same earlier (a server, once warm: a
  process killed by a signal runs no ``atexit`` handler).

Trust, signing, the local tier and read-only mode are those of ``plancache.caches`` (every
``PLANCACHE_*`` setting). Sharing is on where ``PLANCACHE_TRITON_CACHE`` says ``1`` or, when
it is unset, where ``PLANCACHE_URL`` is set and ``PLANCACHE_COMPILE_CACHE`` is not ``0``;
decided once per process, at the first kernel key. Off, or misconfigured (a warning), the
manager is exactly Triton's file cache manager. Nothing here raises into Triton.

Importing this module imports neither Triton nor torch: ``CacheManager`` is defined on
first access (Triton's lookup of ``module:Class`` is one).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plancache import _background as background
from plancache import _metrics as metrics
from plancache._artifacts.archive import GROUP_PREFIX
from plancache._background import Job
from plancache._redaction import printable
from plancache._switches import triton_on
from plancache.caches import CachePushed, CacheShare, GeneratedCache, triton_cache

log = logging.getLogger("plancache.triton")


class _Session:
    """One cache directory in this process: its pull (started once, waited for with a
    bound) and what this process did to it since (key directories touched)."""

    def __init__(self, root: Path, share: CacheShare) -> None:
        self.root, self.share = root, share
        self.lock = threading.Lock()
        self.cache: GeneratedCache | None = None
        self.known: set[str] = set()
        """Paths the pulled bundles hold, and those pushed since: never pushed again."""
        self.touched: set[str] = set()
        """Key directories this process wrote or found a kernel in, not pushed yet."""
        self.bundles = 0
        """Bundles the pull read: compiles after it are counted (``compiled``)."""
        self.compiled: list[tuple[str, str]] = []
        """(key, group file) of each kernel compiled once the pull had read bundles."""
        self.deadline = time.monotonic() + share.fetch_timeout
        self.pulling: Job[None] = background.start(self._pull, "plancache-triton-pull")
        self.warned = False

    def _pull(self) -> None:
        try:
            cache = triton_cache(self.root)
            with self.lock:
                self.cache = cache
            fetched = self.share.pull(cache)
        except Exception as exc:  # Triton compiles as usual
            log.warning("plancache: triton cache: not pulled: %s: %s", type(exc).__name__, exc)
            return
        with self.lock:
            self.known |= fetched.known - fetched.found  # a kernel it uses is its own
            self.bundles = fetched.bundles
        log.info(
            "plancache: triton cache: %s, %d bundles, %d files installed (%.3f s)",
            fetched.reason,
            fetched.bundles,
            fetched.installed,
            fetched.seconds,
        )

    def wait_pulled(self) -> None:
        """Wait for the pull until its deadline (once past it, not at all)."""
        if self.pulling.join(self.deadline - time.monotonic()):
            return
        with self.lock:
            warned, self.warned = self.warned, True
        if not warned:
            log.warning(
                "plancache: triton cache: pull not done within %g s (PLANCACHE_COMPILE_TIMEOUT):"
                " Triton compiles what it lacks",
                self.share.fetch_timeout,
            )

    def touch(self, key: str) -> None:
        with self.lock:
            self.touched.add(key)

    def stored(self, key: str, filename: str) -> None:
        """Triton stored ``filename`` under ``key``: a group file is a kernel compiled here."""
        with self.lock:
            self.touched.add(key)
            if self.bundles and filename.startswith(GROUP_PREFIX):
                self.compiled.append((key, filename))

    def report_rebuilt(self) -> int:
        """One WARNING (and the metric) for the kernels compiled after bundles were
        installed, not reported yet; how many."""
        with self.lock:
            compiled, self.compiled = self.compiled, []
            bundles = self.bundles
        return report_rebuilt([name for _, name in compiled], bundles)

    def push(self) -> CachePushed | None:
        """Store the files of the touched key directories that no pulled or pushed bundle
        holds, as one bundle; None where nothing was touched. Raises what ``push`` raises."""
        self.report_rebuilt()
        with self.lock:
            touched, cache = set(self.touched), self.cache
        if not touched:
            return None
        if cache is None:  # the pull has not even scoped it yet
            cache = triton_cache(self.root)
        ours, others = _files(self.root, touched)
        with self.lock:
            exclude = others | self.known
        pushed = self.share.push(cache, exclude)
        with self.lock:
            self.known |= ours
            self.touched -= touched
        if not pushed.files:
            return pushed
        log.info(
            "plancache: triton cache: %d files stored as one bundle (%s)",
            pushed.files,
            " ".join(f"{k}={'created' if v else 'there'}" for k, v in pushed.written.items())
            or "not written",
        )
        return pushed


def compiled_since(root: Path, known: frozenset[str]) -> list[str]:
    """The group files (``<key>/__grp__<name>.json``: one per kernel Triton compiled) below
    ``root`` that ``known`` (the paths of the bundles a fetch read, and of the files there
    before it) does not list."""
    try:
        found = [f"{p.parent.name}/{p.name}" for p in root.glob(f"*/{GROUP_PREFIX}*.json")]
    except OSError:
        return []
    return sorted(rel for rel in found if rel not in known)


def report_rebuilt(group_files: list[str], bundles: int) -> int:
    """Where ``bundles`` were installed, one WARNING naming the kernels of ``group_files``
    (compiled although they were: none of them held these) and the metric
    ``plancache_rebuilt_total{kind="cache_triton"}``; how many."""
    if not group_files or not bundles:
        return 0
    names = sorted(
        {Path(f).name.removeprefix(GROUP_PREFIX).removesuffix(".json") for f in group_files}
    )
    log.warning(
        "plancache: triton cache: %d kernels compiled although %d bundles were installed "
        "(%s): no pulled bundle holds their keys; likely a kernel not shared yet, or a "
        "setting in Triton's key that differs between the nodes (TRITON_* variables, the "
        "Triton, CUDA or driver version)",
        len(group_files),
        bundles,
        ", ".join(printable(n)[:80] for n in names[:8]) + (", ..." if len(names) > 8 else ""),
    )
    metrics.rebuilt("cache_triton", len(group_files))
    return len(group_files)


def _files(root: Path, keys: set[str]) -> tuple[set[str], set[str]]:
    """The relative paths of the files below ``root``: those in the key directories
    ``keys``, and the others."""
    ours: set[str] = set()
    others: set[str] = set()
    for dirpath, _, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        top = rel.parts[0] if rel.parts else ""
        for name in filenames:
            (ours if top in keys else others).add((rel / name).as_posix())
    return ours, others


class _Exit:
    """The thread that pushes every session at the process's exit: started with the first
    session, never at exit (Python 3.12 and later start no thread during shutdown)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.go = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._run, name="plancache-triton-exit", daemon=True).start()

    def _run(self) -> None:
        while not self.go.wait(3600.0):
            pass  # idle until the exit, a daemon: it keeps nothing alive
        try:
            with _lock:
                sessions = [s for s in _sessions.values() if s is not None]
            for session in sessions:
                _pushed(session.push)
        finally:
            self.done.set()


_lock = threading.Lock()
_on: bool | None = None
"""Whether this process shares Triton's cache (decided at the first kernel key)."""
_sessions: dict[Path, _Session | None] = {}
"""Per cache directory: its session, or None where opening the store failed (plain)."""
_exit: _Exit | None = None
_define_lock = threading.Lock()
"""Held while ``CacheManager`` is defined (not ``_lock``: defining it imports Triton)."""


def _session(root: Path) -> _Session | None:
    """The session of cache directory ``root``, started on first use (None: not shared)."""
    global _on, _exit
    with _lock:
        if _on is None:
            _on = triton_on()
            if _on:
                atexit.register(_at_exit)
        if not _on:
            return None
        if root not in _sessions:
            try:
                _sessions[root] = _Session(root, CacheShare.from_env())
                if _exit is None:
                    _exit = _Exit()
            except Exception as exc:  # misconfigured: Triton's file cache as usual
                log.warning("plancache: triton cache not shared: %s: %s", type(exc).__name__, exc)
                _sessions[root] = None
        return _sessions[root]


def _forget_in_child() -> None:
    """A forked child starts afresh: the parent's threads and clients are not its own, and
    what the parent touched is the parent's to push."""
    global _lock, _define_lock, _exit
    _lock, _define_lock = threading.Lock(), threading.Lock()
    _sessions.clear()
    _exit = None


os.register_at_fork(after_in_child=_forget_in_child)


def _pushed(run: Callable[[], CachePushed | None]) -> CachePushed | None:
    """``run()``, its failure logged (the program goes on as without plancache)."""
    try:
        return run()
    except Exception as exc:
        log.warning("plancache: triton cache: not stored: %s: %s", type(exc).__name__, exc)
        return None


def push(timeout: float | None = None) -> list[CachePushed]:
    """Store now what this process added to each shared cache directory (see the module
    docstring), one bundle each, waiting at most ``timeout`` seconds in all (default:
    ``PLANCACHE_COMPILE_EXIT_WAIT``); a push still running then is abandoned (nothing is
    stored). Returns what each finished push did. Never raises. Call it while the process
    runs (from an ``atexit`` handler, Python 3.12 and later start no thread): the exit's own
    push is already arranged."""
    with _lock:
        sessions = [s for s in _sessions.values() if s is not None]
    if not sessions:
        return []
    wait = sessions[0].share.exit_wait if timeout is None else timeout
    deadline = time.monotonic() + wait
    jobs = [
        background.start(functools.partial(_pushed, s.push), "plancache-triton-push")
        for s in sessions
    ]
    out: list[CachePushed] = []
    for job in jobs:
        if not job.join(deadline - time.monotonic()):
            log.warning("plancache: triton cache: push not done within %g s: abandoned", wait)
            break
        pushed = job.wait(0)
        if pushed is not None:
            out.append(pushed)
    return out


def _at_exit() -> None:
    """Let the exit thread push, and wait for it at most ``PLANCACHE_COMPILE_EXIT_WAIT``."""
    with _lock:
        done, sessions = _exit, [s for s in _sessions.values() if s is not None]
    if done is None or done.pid != os.getpid() or not sessions:
        return
    wait = sessions[0].share.exit_wait
    done.go.set()
    if not done.done.wait(wait):
        log.warning("plancache: triton cache: push not done within %g s at exit: abandoned", wait)


def _define() -> type:
    """Triton's ``FileCacheManager``, sharing (see the module docstring)."""
    from triton.runtime.cache import FileCacheManager

    class CacheManager(FileCacheManager):  # type: ignore[misc]  # Triton's class: Any here
        """Triton's file cache manager; where plancache is configured, each cache directory
        is pulled before its first use in a process, and what this process added is pushed
        at its exit (``plancache.integrations.triton``)."""

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            super().__init__(key, override=override, dump=dump)
            self._plancache: _Session | None = None
            if override or dump:
                return  # Triton's dump and override directories are not caches
            try:
                self._plancache = _session(Path(self.cache_dir).parent)
                if self._plancache is not None:
                    self._plancache.wait_pulled()
            except Exception as exc:  # never into Triton
                log.warning("plancache: triton cache: %s: %s", type(exc).__name__, exc)

        def get_group(self, filename: str) -> dict[str, str] | None:
            group: dict[str, str] | None = super().get_group(filename)
            if group is not None and self._plancache is not None:
                self._plancache.touch(self.key)
            return group

        def put(self, data: Any, filename: str, binary: bool = True) -> str:
            path: str = super().put(data, filename, binary=binary)
            if self._plancache is not None:
                self._plancache.stored(self.key, filename)
            return path

    CacheManager.__module__ = __name__
    CacheManager.__qualname__ = "CacheManager"
    return CacheManager


def __getattr__(name: str) -> Any:
    if name == "CacheManager":
        with _define_lock:
            cls = globals().get("CacheManager")
            if cls is None:
                cls = globals()["CacheManager"] = _define()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
