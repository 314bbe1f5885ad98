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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
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
from plancache._reasons import Reason
from plancache._redaction import printable, without_userinfo
from plancache.errors import ConfigError

log = logging.getLogger("plancache")

SHOWN = 5
"""Most paths a line names (the count says how many there are)."""

__all__ = [
    "CacheFetched",
    "CachePushed",
    "CacheShare",
    "GeneratedCache",
    "Shared",
    "device",
    "directory_cache",
    "inductor_cache",
    "sharing",
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


@dataclass
class Shared:
    """What ``sharing`` did: one ``CacheFetched`` per cache at enter, and at exit one
    ``CachePushed`` per cache (None: that push failed or did not end in time, logged)."""

    pulled: list[CacheFetched]
    pushed: list[CachePushed | None] = field(default_factory=list)


_announced: set[str] = set()
_warned_unsigned: set[str] = set()
_said = threading.Lock()


def _once(seen: set[str], key: str) -> bool:
    """True the first time ``key`` is in ``seen`` in this process."""
    with _said:
        first = key not in seen
        seen.add(key)
    return first


def _announce(settings: Settings) -> None:
    """Log, once per process and store, the store generated caches go to (WARNING where
    nothing configured it: the local default, nothing leaves this machine)."""
    if _once(_announced, settings.url):
        level = logging.INFO if settings.url_given else logging.WARNING
        log.log(level, "plancache: generated caches: store %s", settings.described())


def _warn_unsigned(url: str) -> None:
    if _once(_warned_unsigned, url):
        log.warning(
            "plancache: cache bundles stored unsigned in %s: nodes with a key "
            "(PLANCACHE_SIGNING_KEY or PLANCACHE_VERIFY_KEYS) never install them, nodes without "
            "one only with PLANCACHE_COMPILE_TRUST_UNSIGNED=1; sign them: set "
            "PLANCACHE_SIGNING_KEY where they are pushed",
            without_userinfo(url),
        )


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
        """From every ``PLANCACHE_*`` setting; raises ``ConfigError`` naming a malformed one,
        ``UnsupportedStoreError`` (a ``PlancacheError`` and ``ValueError``) for a store URL
        no backend serves (``s3:/x`` without ``//``, ``s4://``), naming the accepted forms.
        Logs the store it uses once per process: a WARNING where ``PLANCACHE_URL`` is unset
        (the local default serves: nothing leaves this machine), else INFO."""
        settings = Settings.from_env(environ)
        share = cls(settings, CompileSettings.from_env(environ))
        _announce(settings)
        return share

    def pull(
        self, cache: GeneratedCache, *, progress: Callable[[int, int], None] | None = None
    ) -> CacheFetched:
        """Install below ``cache.root`` every trusted, valid bundle of its kind and scope,
        each file create-if-absent, within ``PLANCACHE_COMPILE_TIMEOUT``: past it, whatever
        the backend does, ``timeout`` (the fetch, left on a daemon thread, installs nothing
        more). A file the directory holds with other bytes than a bundle's is kept as it is
        and named (``differing``, one WARNING); the files it held before that no bundle
        lists are ``found``. Never raises: ``reason`` says what happened (``error``:
        ``cache.root`` could not be made or opened), ``known`` lists every path a push
        leaves out (the bundles' and ``found``: pass it to ``push``); ``progress(done,
        listed)`` after each bundle."""
        start = time.monotonic()
        try:
            Directory.make(cache.root).close()
        except OSError as exc:  # nothing can be installed there: said, not raised
            log.warning("plancache: %s cache: not pulled: %s", cache.kind, printable(str(exc)))
            return CacheFetched(Reason.ERROR, seconds=time.monotonic() - start)
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
            return CacheFetched(Reason.TIMEOUT, seconds=time.monotonic() - start)
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
        found = frozenset(before - fetched.known)
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
        be stored; ``progress(done, files)`` as each file is streamed. A bundle stored
        unsigned on a remote store is said once per process (WARNING: nodes with a key never
        take it). Raises ``ArtifactError`` where a file changed while it was read."""
        info = dict(producer() if producer_info is None else producer_info)
        bundles = self._artifacts.bundles
        files, skipped = bundles.delta(cache.kind, cache.scope, cache.root, frozenset(known))
        written: dict[str, bool] = {}
        if files and not dry_run:
            written = bundles.store(
                cache.kind, cache.scope, cache.root, files, info, progress, dict(cache.factors)
            )
        unsigned = self._artifacts.keyring.signing_key_id is None
        if written.get("store") and self._artifacts.remote and unsigned:
            _warn_unsigned(self._artifacts.settings.url)
        return CachePushed(
            len(files),
            written,
            sum(f.size for f in files),
            skipped.files,
            skipped.bytes,
            dry_run,
        )

    def push_within(
        self, cache: GeneratedCache, known: frozenset[str] | set[str], timeout: float
    ) -> CachePushed | None:
        """``push`` on a daemon thread, waited for at most ``timeout`` seconds (then
        abandoned: an abandoned upload stores nothing); None where it failed or did not end
        in time (logged). Never raises."""
        job = background.start(functools.partial(self.push, cache, known), "plancache-cache-push")
        try:
            if job.join(max(timeout, 0.0)):
                return job.wait(0)
            log.warning(
                "plancache: %s cache: push not done within %g s: abandoned", cache.kind, timeout
            )
        except Exception as exc:  # the program's result stands without it
            log.warning(
                "plancache: %s cache: not stored: %s: %s", cache.kind, type(exc).__name__, exc
            )
        return None

    @contextlib.contextmanager
    def sharing(self, *caches: GeneratedCache) -> Iterator[Shared]:
        """Pull each of ``caches`` at enter (each within ``fetch_timeout``), push what the
        block added to each at exit, also where it raised (within ``exit_wait`` in all).
        Yields a ``Shared``: ``pulled`` at enter, ``pushed`` filled at exit. Raises nothing
        of its own: a store's failure is logged and the block runs as without plancache."""
        shared = Shared([self.pull(cache) for cache in caches])
        try:
            yield shared
        finally:
            deadline = time.monotonic() + self.exit_wait
            for cache, pulled in zip(caches, shared.pulled, strict=True):
                remaining = deadline - time.monotonic()
                shared.pushed.append(self.push_within(cache, pulled.known, remaining))

    def close(self) -> None:
        self._artifacts.close()

    def __enter__(self) -> CacheShare:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def sharing(*caches: GeneratedCache, environ: Mapping[str, str] | None = None) -> Iterator[Shared]:
    """The one line for the common case: ``with sharing(inductor_cache()): main()`` pulls
    each cache before the block and pushes what the block added after it, on the stores
    every ``PLANCACHE_*`` setting names (``CacheShare.from_env(environ)``, closed after;
    ``CacheShare.sharing``). Raises only what ``from_env`` raises for a bad setting."""
    with CacheShare.from_env(environ) as share, share.sharing(*caches) as shared:
        yield shared
