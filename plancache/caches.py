"""Share generated-cache directories through plancache's stores, for any program (public).

A generated cache is a directory whose files are named by their own keys (Triton's
``TRITON_CACHE_DIR``, Inductor's ``TORCHINDUCTOR_CACHE_DIR``, a JIT's build directory): a
file at a path is the same wherever the factors its *scope* hashes hold. plancache stores
what a node added to such a directory as one signed bundle (``cache_<kind>_<scope>_<content>
.tar``, named by its content: nodes that add the same files write one object) and installs,
on another node, every trusted bundle of the same kind and scope, file by file,
create-if-absent (Triton's group files last: no kernel is visible before its files).

Guarantees (those of the vLLM plugin's bundles, which use these same pieces):

- trust: with a signing or verify key, only bundles validly signed by an accepted key are
  installed; without one, only from a local store only this user or root could write, or
  from a remote store with ``PLANCACHE_COMPILE_TRUST_UNSIGNED=1`` (docs/compile.md);
- bounded: a pull returns within ``PLANCACHE_COMPILE_TIMEOUT`` seconds over any backend (a
  registered one whose calls stall too: ``timeout``, and it installs nothing after), reads
  at most ``GeneratedCache.max_bundles`` bundles of a store (1,024 by default), at most
  ``PLANCACHE_COMPILE_MAX_BYTES`` a bundle; neither ``pull`` nor ``push`` raises for a
  store's failure (the program builds its cache as without plancache);
- the store, local tier, keys and read-only mode are those of every ``PLANCACHE_*``
  setting (``Settings.from_env``), the store behind the conformance guard.

Example::

    from plancache.caches import CacheShare, triton_cache

    cache = triton_cache()
    with CacheShare.from_env() as share:
        pulled = share.pull(cache)          # before the program compiles
        ...                                 # run: Triton compiles what was not there
        share.push(cache, pulled.known)     # what this run added, as one bundle
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from plancache import _background as background
from plancache._artifacts.bundles import MAX_BUNDLES
from plancache._artifacts.engine import CacheFetched, CompileSettings
from plancache._artifacts.manifest import is_cache_kind
from plancache._artifacts.packing import cache_paths
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings
from plancache._directory import Directory
from plancache._keys import Scalar, fingerprint
from plancache._redaction import printable
from plancache.errors import ConfigError

log = logging.getLogger("plancache")

SHOWN = 5
"""Most paths a line names (the count says how many there are)."""

__all__ = [
    "CacheFetched",
    "CachePushed",
    "CacheShare",
    "GeneratedCache",
    "device",
    "directory_cache",
    "inductor_cache",
    "triton_cache",
]


@dataclass(frozen=True)
class GeneratedCache:
    """One generated cache on this node: its kind (``[a-z][a-z0-9_]{0,31}``), where it is
    kept, its scope (the fingerprint of the factors its files are valid under), and the
    most bundles a pull reads from a store (a kind's own cap may be lower)."""

    kind: str
    root: Path
    scope: str
    max_bundles: int = MAX_BUNDLES
    factors: tuple[tuple[str, Scalar], ...] = ()
    """The factors ``scope`` hashes (without ``cache``), carried by its bundles for
    ``plancache ls``; empty where unknown."""


@dataclass(frozen=True)
class CachePushed:
    """What a push did: the files the bundle held and their bytes (0: nothing new, nothing
    written), {destination: created} (False: that bundle was stored already; a destination
    missing: not written there, logged; empty on a dry run), the files of the directory it
    left out and their bytes (``skipped``: a pull's bundles or a stored bundle hold them, or
    they were there before the pull), and whether it was a dry run (nothing written)."""

    files: int
    written: dict[str, bool]
    bytes: int = 0
    skipped: int = 0
    skipped_bytes: int = 0
    dry_run: bool = False

    @property
    def stored(self) -> bool:
        """True where the store holds the bundle now (written or there already)."""
        return "store" in self.written


def directory_cache(
    kind: str, root: str | os.PathLike[str], factors: Mapping[str, Scalar]
) -> GeneratedCache:
    """The generated cache ``kind`` kept in ``root``, valid where ``factors`` hold (every
    version, device and setting its files depend on that their names do not carry). Raises
    ``ConfigError`` for a malformed kind and ``InvalidPlanError`` for factors that cannot be
    hashed."""
    if not is_cache_kind(kind):
        raise ConfigError(
            f"{kind!r:.40} is not a cache kind: [a-z][a-z0-9_]{{0,31}}, not 'compile'"
        )
    scope = fingerprint({**factors, "cache": kind})
    return GeneratedCache(
        kind, Path(root).expanduser(), scope, factors=tuple(sorted(factors.items()))
    )


def device() -> str:
    """This process's GPU as ``"<name> sm_<major><minor>"`` (CUDA, through torch), or
    ``"none"`` without one (or without torch)."""
    try:
        import torch
    except ImportError:
        return "none"
    if not torch.cuda.is_available():
        return "none"
    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} sm_{major}{minor}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"{package} is not installed: no {package} cache to share") from None


def triton_cache(
    root: str | os.PathLike[str] | None = None, *, gpu: str | None = None
) -> GeneratedCache:
    """Triton's cache (``root``; default ``TRITON_CACHE_DIR`` or ``~/.triton/cache``),
    scoped by Triton's version and the GPU (``gpu``; default ``device()``). Raises
    ``ConfigError`` where Triton is not installed."""
    version = _version("triton")
    where = root or os.environ.get("TRITON_CACHE_DIR") or "~/.triton/cache"
    return directory_cache("triton", where, {"triton": version, "device": gpu or device()})


def inductor_cache(
    root: str | os.PathLike[str] | None = None, *, gpu: str | None = None
) -> GeneratedCache:
    """Inductor's cache (``root``; default ``TORCHINDUCTOR_CACHE_DIR`` or torch's own
    default), scoped by torch's and Triton's versions and the GPU. Raises ``ConfigError``
    where torch is not installed."""
    factors: dict[str, Scalar] = {"torch": _version("torch"), "device": gpu or device()}
    try:
        factors["triton"] = _version("triton")
    except ConfigError:
        factors["triton"] = "none"
    if root is None:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        root = cache_dir()
    return directory_cache("inductor", root, factors)


def producer() -> dict[str, object]:
    """Who made a bundle: the host and torch's version where installed."""
    out: dict[str, object] = {"host": socket.gethostname()}
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        out["torch"] = importlib.metadata.version("torch")
    return out


class CacheShare:
    """Generated caches on the configured stores (see the module docstring)."""

    def __init__(self, settings: Settings, compile: CompileSettings | None = None) -> None:
        self._compile = CompileSettings.from_env() if compile is None else compile
        self._artifacts = ArtifactStore(settings, self._compile)

    @property
    def fetch_timeout(self) -> float:
        """Seconds a ``pull`` may take in all (``PLANCACHE_COMPILE_TIMEOUT``): a caller that
        waits for one in another thread waits this long at most."""
        return self._compile.fetch_timeout

    @property
    def exit_wait(self) -> float:
        """Seconds an upload may delay the process's exit (``PLANCACHE_COMPILE_EXIT_WAIT``):
        a ``push`` started at exit is waited for this long at most, then abandoned."""
        return self._compile.exit_wait

    @property
    def max_bytes(self) -> int:
        """The most bytes a bundle holds (``PLANCACHE_COMPILE_MAX_BYTES``): ``push`` leaves
        the files past it for a later bundle, ``pull`` refuses a larger bundle."""
        return self._compile.max_bytes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CacheShare:
        """From every ``PLANCACHE_*`` setting; raises ``ConfigError`` naming a malformed one."""
        return cls(Settings.from_env(environ), CompileSettings.from_env(environ))

    def pull(
        self, cache: GeneratedCache, *, progress: Callable[[int, int], None] | None = None
    ) -> CacheFetched:
        """Install below ``cache.root`` every trusted, valid bundle of its kind and scope,
        each file create-if-absent, within ``PLANCACHE_COMPILE_TIMEOUT``: past it, whatever
        the backend does, ``timeout`` (the fetch, left on a daemon thread, installs nothing
        more). A file the directory holds with other bytes than a bundle's is kept as it is
        and named (``differing``, one WARNING); the files it held before that no bundle
        lists are ``found``. Never raises: ``reason`` says what happened, ``known`` lists
        every path a push leaves out (the bundles' and ``found``: pass it to ``push``);
        ``progress(done, listed)`` after each bundle."""
        start = time.monotonic()
        Directory.make(cache.root).close()
        stop = threading.Event()
        job = background.start(
            functools.partial(self._pull, cache, stop.is_set, progress), "plancache-cache-pull"
        )
        if not job.join(self.fetch_timeout - (time.monotonic() - start)):
            stop.set()
            log.warning(
                "plancache: %s cache: pull not done within %g s: timeout",
                cache.kind,
                self.fetch_timeout,
            )
            return CacheFetched("timeout", seconds=time.monotonic() - start)
        return job.wait(0)

    def _pull(
        self,
        cache: GeneratedCache,
        cancelled: Callable[[], bool],
        progress: Callable[[int, int], None] | None,
    ) -> CacheFetched:
        """``pull``'s work: what the directory holds first, then the fetch."""
        before = cache_paths(cache.root)
        fetched = self._artifacts.fetch_cache(
            cache.kind,
            cache.scope,
            cache.root,
            max_bundles=cache.max_bundles,
            cancelled=cancelled,
            progress=progress,
        )
        if fetched.differing:
            log.warning(
                "plancache: %s cache %s: %d files differ from the stored bundles' and are "
                "kept as they are (not replaced; remove them to install the stored ones): %s",
                cache.kind,
                printable(str(cache.root)),
                len(fetched.differing),
                ", ".join(printable(p) for p in fetched.differing[:SHOWN]),
            )
        found = before - fetched.known
        return dataclasses.replace(fetched, found=found, known=fetched.known | found)

    def push(
        self,
        cache: GeneratedCache,
        known: frozenset[str] | set[str] = frozenset(),
        producer_info: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> CachePushed:
        """Store the files below ``cache.root`` that ``known`` does not list (nor a trusted
        stored bundle holds) as one bundle, create-if-absent, on the store (unless it
        refuses writes: logged), then on the local tier; ``dry_run``: only say what would
        be stored; ``progress(done, files)`` as each file is streamed. Raises
        ``ArtifactError`` where a file changed while it was read."""
        info = dict(producer() if producer_info is None else producer_info)
        bundles = self._artifacts.bundles
        files, skipped = bundles.delta(cache.kind, cache.scope, cache.root, frozenset(known))
        written: dict[str, bool] = {}
        if files and not dry_run:
            written = bundles.store(
                cache.kind, cache.scope, cache.root, files, info, progress, dict(cache.factors)
            )
        return CachePushed(
            len(files),
            written,
            sum(f.size for f in files),
            skipped.files,
            skipped.bytes,
            dry_run,
        )

    def close(self) -> None:
        self._artifacts.close()

    def __enter__(self) -> CacheShare:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
