"""Pack a rank's AOT directory, or the new files of a generated cache, into a stream (local
I/O; the reading side is ``archive``).

The stream is a ustar archive: the manifest first (``.plancache/manifest.json``), then one
regular file per manifest entry, in the manifest's order; zstd-compressed when ``zstandard``
is importable (a reader recognises either by the first bytes). It is read in chunks of
``CHUNK`` bytes: memory does not grow with the artifact's size.

Guarantees: a manifest lists only regular files under safe relative paths, within the caps
(``MAX_FILES``, the byte cap), each with its size, sha256 and mode (0o644 or 0o755); the
stream carries exactly the bytes the manifest's digests name: a file that changed since it
was scanned raises ``ArtifactError`` mid-stream (the upload is abandoned, never completed).
A cache bundle (``scan_cache``, ``pack_cache``) holds what a node added to a generated cache
(not what ``known`` lists), leaving out temp files, lock files and lock directories.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from plancache._artifacts.manifest import (
    DEFAULT_MAX_BYTES,
    INDUCTOR_DIR,
    MANIFEST_NAME,
    MAX_FILES,
    FileEntry,
    Manifest,
    check_path,
)
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import ArtifactError, InvalidPlanError

CHUNK = 1 << 20
BLOCK = 512


def zstd_available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def scan(root: Path, key: str, rank: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[FileEntry]:
    """Every regular file of ``root/inductor_cache`` and ``root/rank`` (``root`` is vLLM's
    ``<key>`` directory) with its digest; plancache's own files and vLLM's temp files are
    left out. ``ArtifactError`` if the rank has no ``model``, a name is unsafe, or a cap is
    exceeded."""
    entries: list[FileEntry] = []
    total = 0
    for top in (INDUCTOR_DIR, rank):
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".plancache"))
            for name in sorted(filenames):
                if name.startswith(".plancache") or name.endswith(".tmp"):
                    continue
                path = Path(dirpath) / name
                rel = path.relative_to(root).as_posix()
                st = path.lstat()
                if not stat.S_ISREG(st.st_mode):
                    continue  # vLLM writes regular files only; nothing else is shared
                try:
                    check_path(rel, rank)
                except InvalidPlanError as exc:
                    raise ArtifactError(str(exc)) from None
                total += st.st_size
                if total > max_bytes or len(entries) >= MAX_FILES:
                    raise ArtifactError(f"over the caps ({max_bytes} bytes, {MAX_FILES} files)")
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                entries.append(FileEntry(rel, st.st_size, _digest(path), mode))
    if f"{rank}/model" not in {e.path for e in entries}:
        raise ArtifactError(f"{root / rank} holds no model")
    return entries


SKIPPED_DIRS = ("locks", "lock")
"""Directory names never shared from a cache (lock files of its writers)."""


def scan_cache(
    root: Path,
    known: frozenset[str] = frozenset(),
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[FileEntry]:
    """The regular files below ``root`` (a generated cache) whose paths are not in
    ``known``, with their digests, in path order, at most ``MAX_FILES`` and ``max_bytes`` in
    all (past a cap, the rest is left for a later bundle). Left out: names starting with a
    dot or ``tmp.`` (temp files and directories of the cache's writers, plancache's own),
    ``*.tmp``, ``*.lock``, lock directories, and names no bundle may hold."""
    entries: list[FileEntry] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith((".", "tmp.")) and d not in SKIPPED_DIRS
        )
        for name in sorted(filenames):
            if name.startswith((".", "tmp.")) or name.endswith((".tmp", ".lock")):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel in known:
                continue
            try:
                check_path(rel, "")
                st = path.lstat()
            except (InvalidPlanError, OSError):
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if total + st.st_size > max_bytes or len(entries) >= MAX_FILES:
                return entries
            total += st.st_size
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            entries.append(FileEntry(rel, st.st_size, _digest(path), mode))
    return entries


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _header(name: str, size: int, mode: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, mode, 0, tarfile.REGTYPE
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def tar_chunks(root: Path, manifest: Manifest) -> Iterator[bytes]:
    """The uncompressed archive of ``manifest``'s files under ``root``, in chunks. Each file
    is digested again as it is read: one that changed since ``scan`` raises
    ``ArtifactError`` (the caller's upload is then abandoned, never completed)."""
    data = manifest.encode()
    yield _header(MANIFEST_NAME, len(data), 0o644) + data + _padding(len(data))
    for entry in manifest.files:
        yield _header(entry.path, entry.size, entry.mode)
        h, size = hashlib.sha256(), 0
        fd = os.open(root / entry.path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            while size < entry.size and (chunk := f.read(min(CHUNK, entry.size - size))):
                h.update(chunk)
                size += len(chunk)
                yield chunk
        if size != entry.size or h.hexdigest() != entry.sha256:
            raise ArtifactError(f"{entry.path} changed while it was uploaded")
        yield _padding(entry.size)
    yield b"\0" * (2 * BLOCK)


def compressed(chunks: Iterator[bytes], level: int = 3) -> Iterator[bytes]:
    """``chunks`` as one zstd frame, in chunks (bounded memory)."""
    import zstandard

    compressor = zstandard.ZstdCompressor(level=level).compressobj()
    for chunk in chunks:
        out = compressor.compress(chunk)
        if out:
            yield out
    yield compressor.flush()


def pack(
    root: Path,
    key: str,
    rank: str,
    *,
    keyring: Keyring = NO_KEYS,
    labels: dict[str, object] | None = None,
    producer: dict[str, object] | None = None,
    compress: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
    created_at: float | None = None,
) -> tuple[Manifest, Iterator[bytes]]:
    """The manifest of ``root``'s files for ``rank`` (signed when ``keyring`` can sign;
    ``created_at`` default: now) and the stream of the artifact (compressed when asked and
    ``zstandard`` is importable)."""
    files = tuple(scan(root, key, rank, max_bytes=max_bytes))
    manifest = Manifest(key, rank, files, producer=producer or {}, labels=labels or {})
    if created_at is not None:
        manifest = replace(manifest, created_at=created_at)
    return _signed_stream(root, manifest, keyring, compress)


def pack_cache(
    root: Path,
    kind: str,
    scope: str,
    files: list[FileEntry],
    *,
    keyring: Keyring = NO_KEYS,
    producer: dict[str, object] | None = None,
    compress: bool = True,
) -> tuple[Manifest, Iterator[bytes]]:
    """The bundle of ``files`` (from ``scan_cache(root)``) of cache ``kind`` valid in
    ``scope``, signed when ``keyring`` can sign, and its stream (as ``pack``'s)."""
    manifest = Manifest(scope, "", tuple(files), producer=producer or {}, kind=kind)
    return _signed_stream(root, manifest, keyring, compress)


def _signed_stream(
    root: Path, manifest: Manifest, keyring: Keyring, compress: bool
) -> tuple[Manifest, Iterator[bytes]]:
    manifest = manifest.signed_with(keyring)
    chunks = tar_chunks(root, manifest)
    if compress and zstd_available():
        chunks = compressed(chunks)
    return manifest, chunks
