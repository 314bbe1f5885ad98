"""torch's mega-cache (``torch.compiler.save_cache_artifacts``) on plancache's stores (public).

torch hands its users the bytes of every cache artifact a process's ``torch.compile`` made
(Inductor's FX graphs and kernels, AOTAutograd's, autotuning results) and leaves where to
keep them to the user. ``save(name)`` stores those bytes as a cache bundle of one file
(``plancache.caches``: kind ``torch_mega``), and ``load(name)`` fetches every bundle stored
under ``name`` and hands each to ``torch.compiler.load_cache_artifacts``, so that the next
``torch.compile`` of the same code finds its artifacts in torch's own caches (Inductor's
FX-graph cache hits).

Guarantees (those of bundles, ``plancache.caches``):

- scope: torch's and Triton's versions, the GPU (``plancache.caches.device``, or ``gpu``)
  and ``name``; another version or GPU never loads these bytes;
- trust: loading them unpickles, so they are trusted as code: with a signing or verify key,
  only bytes validly signed by an accepted key are loaded; without one, only from a local
  store only this user or root could write, or from a remote store with
  ``PLANCACHE_COMPILE_TRUST_UNSIGNED=1``; each file's sha256 is checked against the signed
  manifest, and its name is its sha256;
- herd: a bundle is named by its content and written create-if-absent, looking first: nodes
  that save the same bytes store one object;
- bounds: ``load`` takes at most ``PLANCACHE_COMPILE_TIMEOUT`` to fetch, reads at most
  ``MAX_BLOBS`` (64) bundles of one name a store and hands torch at most ``MAX_BLOBS``
  blobs in all (the first by digest; more are counted in ``left_out`` and logged), each at
  most ``PLANCACHE_COMPILE_MAX_BYTES`` (over it, ``save`` stores nothing and says so);
  neither raises for a store's failure, and ``load`` raises nothing at all: without the
  bytes, torch compiles as usual.

Each ``save`` of other bytes under a name adds one bundle, and ``load`` loads them all: use
one name per program and version (``"llama-8b-v3"``), or prune old bundles
(``plancache prune``).

Importing this module imports no torch; ``save`` and ``load`` do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancache import Reason
from plancache.caches import CacheShare, GeneratedCache, device, directory_cache
from plancache.errors import ConfigError

log = logging.getLogger("plancache.torch")

KIND = "torch_mega"
SUFFIX = ".bin"
MAX_NAME = 200
"""Most characters of a name (a factor of the scope)."""
MAX_BLOBS = 64
"""Most bundles ``load`` reads from a store, and most blobs it hands torch in all."""


def mega_cache(
    name: str, root: str | os.PathLike[str], *, gpu: str | None = None
) -> GeneratedCache:
    """The mega-cache bytes saved under ``name``, kept in ``root``: scoped by torch's and
    Triton's versions, the GPU (``gpu``; default ``device()``) and ``name``. Raises
    ``ConfigError`` for an empty or overlong name, or where torch is not installed."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise ConfigError(f"a mega-cache name is 1 to {MAX_NAME} characters: {name!r:.40}")
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("torch is not installed: no mega-cache to share") from None
    try:
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = "none"
    factors = {"torch": torch_version, "triton": triton_version, "device": gpu or device()}
    cache = directory_cache(KIND, root, {**factors, "name": name})
    return dataclasses.replace(cache, max_bundles=MAX_BLOBS)


@dataclass(frozen=True)
class MegaCacheSaved:
    """What ``save`` did: the bytes' size and sha256 (0 and "": torch had nothing to save),
    {destination: created} (False: stored already), and why nothing was stored, if so."""

    name: str
    bytes: int = 0
    sha256: str = ""
    written: dict[str, bool] = field(default_factory=dict)
    skipped: str | None = None


@dataclass
class MegaCacheLoaded:
    """What ``load`` did: the fetch's reason (``hit``, ``miss``, ``untrusted``, ``invalid``,
    ``store-error``, ``timeout``, or ``error``: see the log), how many blobs torch loaded and
    how many it refused, how many were past ``MAX_BLOBS`` (not handed to torch), what each
    load returned (torch's ``CacheInfo``), and the seconds it all took."""

    name: str
    reason: Reason
    loaded: int = 0
    failed: int = 0
    left_out: int = 0
    infos: list[Any] = field(default_factory=list)
    seconds: float = 0.0


def save(
    name: str,
    artifacts: bytes | None = None,
    *,
    gpu: str | None = None,
    share: CacheShare | None = None,
) -> MegaCacheSaved:
    """Store ``artifacts`` (default: ``torch.compiler.save_cache_artifacts()`` now, what this
    process compiled so far) under ``name`` as one signed bundle of one file, on the store,
    then on the local tier (``share``; default ``CacheShare.from_env()``, closed after).
    Raises ``ConfigError`` for a bad name or configuration; a store's failure is logged and
    leaves ``written`` without that destination."""
    if artifacts is None:
        import torch

        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            log.info("plancache: mega-cache %s: torch has nothing to save", name)
            return MegaCacheSaved(name, skipped="torch had nothing to save")
        artifacts = bytes(saved[0])
    digest = hashlib.sha256(artifacts).hexdigest()
    own = share is None
    opened = CacheShare.from_env() if share is None else share
    try:
        if len(artifacts) > opened.max_bytes:
            why = f"{len(artifacts)} bytes, over PLANCACHE_COMPILE_MAX_BYTES={opened.max_bytes}"
            log.warning("plancache: mega-cache %s: not stored: %s", name, why)
            return MegaCacheSaved(name, len(artifacts), digest, skipped=why)
        with tempfile.TemporaryDirectory(prefix="plancache-mega-") as root:
            (Path(root) / f"{digest}{SUFFIX}").write_bytes(artifacts)
            pushed = opened.push(mega_cache(name, root, gpu=gpu))
    finally:
        if own:
            opened.close()
    log.info(
        "plancache: mega-cache %s: %d bytes stored (%s)",
        name,
        len(artifacts),
        " ".join(f"{k}={'created' if v else 'there'}" for k, v in pushed.written.items())
        or "not written",
    )
    return MegaCacheSaved(name, len(artifacts), digest, pushed.written)


def load(name: str, *, gpu: str | None = None, share: CacheShare | None = None) -> MegaCacheLoaded:
    """Fetch every trusted bundle stored under ``name`` (``share``; default
    ``CacheShare.from_env()``, closed after) and hand each blob to
    ``torch.compiler.load_cache_artifacts``, in the order of their digests. Never raises: a
    failure is logged and reported (``reason``, ``failed``); torch then compiles as usual."""
    start = time.monotonic()
    result = MegaCacheLoaded(name, Reason.ERROR)
    opened = share
    try:
        opened = CacheShare.from_env() if share is None else share
        with tempfile.TemporaryDirectory(prefix="plancache-mega-") as root:
            fetched = opened.pull(mega_cache(name, root, gpu=gpu))
            result.reason = fetched.reason
            blobs = sorted(Path(root).glob(f"*{SUFFIX}"))
            result.left_out = max(0, len(blobs) - MAX_BLOBS)
            if result.left_out:
                log.warning(
                    "plancache: mega-cache %s: %d blobs past the %d loaded left out",
                    name,
                    result.left_out,
                    MAX_BLOBS,
                )
            for blob in blobs[:MAX_BLOBS]:
                info = _load_blob(name, blob)
                if info is None:
                    result.failed += 1
                else:
                    result.loaded += 1
                    result.infos.append(info)
    except Exception as exc:  # never into the program: it compiles as usual
        log.warning("plancache: mega-cache %s: %s: %s", name, type(exc).__name__, exc)
        result.reason = Reason.ERROR
    finally:
        if share is None and opened is not None:
            try:
                opened.close()
            except Exception as exc:
                log.warning("plancache: mega-cache %s: closing the store: %s", name, exc)
    result.seconds = time.monotonic() - start
    log.info(
        "plancache: mega-cache %s: %s, %d loaded, %d refused (%.3f s)",
        name,
        result.reason,
        result.loaded,
        result.failed,
        result.seconds,
    )
    return result


def _load_blob(name: str, blob: Path) -> Any | None:
    """torch's ``CacheInfo`` of loading the mega-cache bytes in ``blob``, or None (logged)."""
    import torch

    data = blob.read_bytes()
    if hashlib.sha256(data).hexdigest() != blob.name.removesuffix(SUFFIX):
        log.warning("plancache: mega-cache %s: %s is not named by its digest", name, blob.name)
        return None
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:  # torch compiles as usual
        log.warning(
            "plancache: mega-cache %s: torch refused it: %s: %s", name, type(exc).__name__, exc
        )
        return None
    if info is None:
        log.warning("plancache: mega-cache %s: torch could not read it (see torch's log)", name)
    return info
