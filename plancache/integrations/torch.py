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

Content, not order: ``save`` stores torch's artifacts sorted and without duplicates (torch's
own encoding, ``canonical``), so the same artifacts saved in another order are the same
object, and leaves out every artifact this process loaded under the same name through
``load`` (stored already): a ``save`` after a ``load`` that compiled nothing new stores
nothing (``skipped``). Each ``save`` of new artifacts under a name adds one bundle, and
``load`` loads them all: use one name per program and version (``"llama-8b-v3"``), or prune
old bundles (``plancache prune``).

Importing this module imports no torch; ``save`` and ``load`` do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import threading
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
    """What ``save`` did: the size and sha256 of the bytes stored (0 and "": none), the
    artifacts they hold and those left out as loaded here already (``loaded``),
    {destination: created} (False: stored already; missing: not written there, logged),
    and why nothing was stored, if so."""

    name: str
    bytes: int = 0
    sha256: str = ""
    written: dict[str, bool] = field(default_factory=dict)
    skipped: str | None = None
    artifacts: int = 0
    loaded: int = 0


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
    data, kept, loaded = canonical(artifacts, _loaded_under(name))
    if data is None:
        why = f"all {loaded} artifacts were loaded from the store: nothing new"
        log.info("plancache: mega-cache %s: nothing stored: %s", name, why)
        return MegaCacheSaved(name, skipped=why, loaded=loaded)
    digest = hashlib.sha256(data).hexdigest()
    own = share is None
    opened = CacheShare.from_env() if share is None else share
    try:
        if len(data) > opened.max_bytes:
            why = f"{len(data)} bytes, over PLANCACHE_COMPILE_MAX_BYTES={opened.max_bytes}"
            log.warning("plancache: mega-cache %s: not stored: %s", name, why)
            return MegaCacheSaved(name, len(data), digest, skipped=why, artifacts=kept)
        with tempfile.TemporaryDirectory(prefix="plancache-mega-") as root:
            (Path(root) / f"{digest}{SUFFIX}").write_bytes(data)
            pushed = opened.push(mega_cache(name, root, gpu=gpu))
    finally:
        if own:
            opened.close()
    # no file new to the store: a stored bundle holds these bytes already
    written = pushed.written if pushed.files else {"store": False}
    log.info("plancache: mega-cache %s: %d bytes %s", name, len(data), said(written))
    return MegaCacheSaved(name, len(data), digest, written, None, kept, loaded)


def said(written: dict[str, bool]) -> str:
    """What a save's ``written`` means, in words that do not contradict each other."""
    if not written:
        return "not stored: no destination took them (see the warnings before)"
    created = [k for k, v in written.items() if v]
    there = [k for k, v in written.items() if not v]
    parts = [f"stored in the {', '.join(created)}"] if created else []
    parts += [f"stored already in the {', '.join(there)}"] if there else []
    return "; ".join(parts)


_loaded: dict[str, set[str]] = {}
"""The digests (``_digest``) of the artifacts ``load`` handed torch, per name: a ``save``
under that name leaves them out."""
_loaded_lock = threading.Lock()


def _loaded_under(name: str) -> frozenset[str]:
    with _loaded_lock:
        return frozenset(_loaded.get(name, ()))


Artifact = tuple[str, str, bytes]
"""One of torch's cache artifacts: its type, key and content."""


def _digest(artifact: Artifact) -> str:
    kind, key, content = artifact
    body = hashlib.sha256(content).hexdigest()
    return hashlib.sha256(f"{kind}\0{key}\0{body}".encode()).hexdigest()


def _artifacts(data: bytes) -> list[Artifact] | None:
    """The artifacts of torch's mega-cache bytes, sorted, each once (torch's own reader:
    it checks the bytes' checksum and version, unpickles nothing); None where this torch
    cannot read them (another format, or no such reader)."""
    try:
        from torch.compiler._cache import CacheArtifactManager

        parsed = CacheArtifactManager.deserialize(data)
    except Exception:  # a torch without this reader: the bytes are taken as they are
        return None
    if parsed is None:
        return None
    return sorted({(kind, a.key, bytes(a.content)) for kind, got in parsed.items() for a in got})


def canonical(data: bytes, loaded: frozenset[str] = frozenset()) -> tuple[bytes | None, int, int]:
    """torch's mega-cache bytes ``data`` as stored: its artifacts sorted, each once, less
    those whose digest ``loaded`` holds, in torch's own encoding (the same artifacts in any
    order: the same bytes); None where every artifact is in ``loaded``. Also how many
    artifacts they hold and how many were left out. Bytes torch cannot read or write again
    are kept as they are (logged)."""
    try:
        from torch.compiler._cache import CacheArtifactFactory, _serialize_single_cache
        from torch.utils._appending_byte_serializer import AppendingByteSerializer

        artifacts = _artifacts(data)
        if artifacts is None:
            raise ValueError("torch could not read them")
        new = [a for a in artifacts if _digest(a) not in loaded]
        if not new:
            return None, 0, len(artifacts)
        writer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
        for kind in sorted({a[0] for a in new}):
            made = [
                CacheArtifactFactory.create(kind, key, body) for t, key, body in new if t == kind
            ]
            writer.append((kind, made))
        return writer.to_bytes(), len(new), len(artifacts) - len(new)
    except Exception as exc:  # another torch's format: stored as torch gave them
        log.info(
            "plancache: mega-cache bytes kept as torch gave them: %s: %s", type(exc).__name__, exc
        )
        return data, 0, 0


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
        return None
    digests = {_digest(a) for a in _artifacts(data) or ()}
    with _loaded_lock:
        _loaded.setdefault(name, set()).update(digests)
    return info
