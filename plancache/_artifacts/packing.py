"""Pack a rank's AOT directory, or the new files of a generated cache, into a stream (local
I/O; the reading side is ``archive``).

The stream is a ustar archive: the manifest first (``.plancache/manifest.json``), then one
regular file per manifest entry, in the manifest's order (a path a ustar header cannot hold,
over 255 characters or with a last component over 100, is carried by a POSIX extended
header holding that path alone, before its file's header); zstd-compressed when ``zstandard``
is importable (a reader recognises either by the first bytes). It is read in chunks of
``CHUNK`` bytes: memory does not grow with the artifact's size.

Guarantees: a manifest lists only regular files under safe relative paths, within the caps
(``MAX_FILES``, the byte cap), each with its size, sha256 and mode (0o644 or 0o755); the
stream carries exactly the bytes the manifest's digests name: a file that changed since it
was scanned raises ``ArtifactError`` mid-stream (the upload is abandoned, never completed).
A cache bundle (``scan_cache``, ``pack_cache``) holds what a node added to a generated cache
(not what ``known`` lists), leaving out temp files, lock files and lock directories; every
other file it leaves out (another user's, one that is not a regular file, a name no bundle
may hold, one past the caps) is counted in one log line and in the ``plancache_left_out``
metric (``_LeftOut``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tarfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from plancache import _metrics as metrics
from plancache._artifacts.manifest import (
    DEFAULT_MAX_BYTES,
    ENTRY_BYTES,
    FILES_ROOM,
    INDUCTOR_DIR,
    MANIFEST_NAME,
    MAX_FILES,
    FileEntry,
    Manifest,
    check_path,
)
from plancache._neighbours import (
    MAX_DEPTH,
    Foreign,
    foreign,
    open_entry,
    open_file,
    uploadable,
    walk,
)
from plancache._redaction import printable
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import ArtifactError, InvalidPlanError

log = logging.getLogger("plancache")

CHUNK = 1 << 20
BLOCK = 512


def zstd_available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class _LeftOut:
    """The files a scan of ``kind`` left out, by why: another user could have written them
    (``owned`` by another user, ``writable`` by all), not a regular file (``odd``: a link, a
    FIFO, a device), in a directory deeper than ``MAX_DEPTH`` (``deep``: each such directory
    counts once), a name no bundle may hold (``named``), past the caps (``capped``).
    ``log`` says it all in one line and counts it in the ``plancache_left_out`` metric."""

    where: Path
    kind: str
    owned: int = 0
    writable: int = 0
    odd: int = 0
    deep: int = 0
    named: int = 0
    capped: int = 0
    example: str = ""

    def foreign(self, path: str, why: Foreign) -> None:
        if why.owner is not None:
            self.owned += 1
        else:
            self.writable += 1
        self.example = self.example or path

    def note(self, why: str, path: str) -> None:
        """One more file left out for ``why`` (``odd``, ``deep``, ``named`` or ``capped``)."""
        setattr(self, why, getattr(self, why) + 1)
        self.example = self.example or path

    def log(self) -> None:
        foreign = self.owned + self.writable
        counts = {
            "foreign": foreign,
            "odd": self.odd,
            "deep": self.deep,
            "name": self.named,
            "cap": self.capped,
        }
        total = sum(counts.values())
        if not total:
            return
        whys = [
            f"{foreign} another user could have written ({self.owned} owned by another user, "
            f"{self.writable} writable by all)"
            if foreign
            else "",
            f"{self.odd} not a regular file" if self.odd else "",
            f"{self.deep} directories more than {MAX_DEPTH} deep" if self.deep else "",
            f"{self.named} named as no bundle may name a file" if self.named else "",
            f"{self.capped} past the bundle's cap (a later upload)" if self.capped else "",
        ]
        log.warning(
            "plancache: %s: %d files left out of the upload: %s; one: %s",
            self.where,
            total,
            "; ".join(w for w in whys if w),
            printable(self.example),
        )
        for why, n in counts.items():
            metrics.left_out(self.kind, why, n)


def _own_files(
    root: Path, skip: Callable[[str, bool], bool], left_out: _LeftOut
) -> Iterator[tuple[str, os.stat_result, BinaryIO]]:
    """(path, fstat, open file) of each regular file below ``root`` that this user (or root)
    owns and others may not write, opened as the walk found it (``plancache._neighbours``:
    no link followed on the way, the same inode); the file is open until the iteration goes
    on. Another user's, or a world-writable one, goes to ``left_out`` (a group-writable one
    of this user's is taken: a group member who could change it could change what this
    node loads itself: the one foreign-writer rule's ``group_only``), and so do links, FIFOs
    and devices, and directories deeper than ``MAX_DEPTH``; files swapped meanwhile are
    skipped."""
    for entry in walk(root, skip):
        if not stat.S_ISREG(entry.st.st_mode):
            left_out.note("deep" if stat.S_ISDIR(entry.st.st_mode) else "odd", entry.path)
            continue
        try:
            fd = open_entry(entry)
        except OSError:  # gone, or swapped since the listing: not this upload's
            continue
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(fd)
            why = foreign(st, f"file {entry.path}")
            if why is not None and not uploadable(why):
                left_out.foreign(entry.path, why)
                continue
            yield entry.path, st, file


def _plancache_or_temp(name: str, directory: bool) -> bool:
    return name.startswith(".plancache") or (not directory and name.endswith(".tmp"))


def scan(root: Path, key: str, rank: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[FileEntry]:
    """Every regular file of ``root/inductor_cache`` and ``root/rank`` (``root`` is vLLM's
    ``<key>`` directory) with its digest (``_own_files``: only this user's, each read as
    the walk found it; what another user could have written is left out and logged);
    plancache's own files and vLLM's temp files are left out. ``ArtifactError`` if the rank
    has no ``model``, a name is unsafe, or a cap is exceeded."""
    entries: list[FileEntry] = []
    total = listed = 0
    left_out = _LeftOut(root, "compile")
    for top in (INDUCTOR_DIR, rank):
        for path, st, file in _own_files(root / top, _plancache_or_temp, left_out):
            rel = f"{top}/{path}"
            try:
                check_path(rel, rank)
            except InvalidPlanError as exc:
                raise ArtifactError(str(exc)) from None
            total += st.st_size
            listed += len(rel) + ENTRY_BYTES
            if total > max_bytes or len(entries) >= MAX_FILES or listed > FILES_ROOM:
                raise ArtifactError(
                    f"over the caps ({max_bytes} bytes, {MAX_FILES} files, a manifest of "
                    f"{FILES_ROOM} bytes)"
                )
            entries.append(FileEntry(rel, st.st_size, _digest(file), _mode(st)))
    left_out.log()
    if f"{rank}/model" not in {e.path for e in entries}:
        raise ArtifactError(f"{root / rank} holds no model")
    return entries


SKIPPED_DIRS = ("locks", "lock")
"""Directory names never shared from a cache (lock files of its writers)."""


def _not_shared(name: str, directory: bool) -> bool:
    """Temp files and directories of a cache's writers (plancache's own too), lock files
    and lock directories."""
    if name.startswith((".", "tmp.")):
        return True
    return name in SKIPPED_DIRS if directory else name.endswith((".tmp", ".lock"))


def scan_cache(
    root: Path,
    known: frozenset[str] = frozenset(),
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    kind: str = "cache",
    skipped: Callable[[int], None] = lambda size: None,
) -> list[FileEntry]:
    """The regular files below ``root`` (a generated cache of ``kind``) whose paths are not
    in ``known``, with their digests, in path order, at most ``MAX_FILES``, ``max_bytes``
    and a manifest's room in all (past a cap, the rest is left for a later bundle): only
    this user's, each read as the walk found it (``_own_files``). Not counted: names
    starting with a dot or ``tmp.`` (temp files and directories of the cache's writers,
    plancache's own), ``*.tmp``, ``*.lock``, lock directories. Counted and logged
    (``_LeftOut``): what another user could have written, what is not a regular file, names
    no bundle may hold, what is past a cap. ``skipped(size)`` is called for each file
    ``known`` lists."""
    entries: list[FileEntry] = []
    total = listed = 0
    left_out = _LeftOut(root, kind)
    for rel, st, file in _own_files(root, _not_shared, left_out):
        if rel in known:
            skipped(st.st_size)
            continue
        try:
            check_path(rel, "")
        except InvalidPlanError:
            left_out.note("named", rel)
            continue
        if left_out.capped or (
            total + st.st_size > max_bytes
            or len(entries) >= MAX_FILES
            or listed + len(rel) + ENTRY_BYTES > FILES_ROOM
        ):
            left_out.note("capped", rel)
            continue
        total += st.st_size
        listed += len(rel) + ENTRY_BYTES
        entries.append(FileEntry(rel, st.st_size, _digest(file), _mode(st)))
    left_out.log()
    return entries


def cache_paths(root: Path) -> frozenset[str]:
    """The paths below ``root`` that ``scan_cache`` would look at (names it does not leave
    out uncounted), listed without reading a file (``walk``: no link followed)."""
    return frozenset(entry.path for entry in walk(root, _not_shared))


def _mode(st: os.stat_result) -> int:
    return 0o755 if st.st_mode & 0o111 else 0o644


def _digest(file: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := file.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _header(name: str, size: int, mode: int) -> bytes:
    """A regular file's ustar header; for a path ustar cannot hold, a POSIX extended header
    holding the path alone, then the file's header (``archive`` reads both)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, mode, 0, tarfile.REGTYPE
    try:
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
    except ValueError:  # "name is too long": the path goes in an extended header
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def tar_chunks(
    root: Path, manifest: Manifest, progress: Callable[[int, int], None] | None = None
) -> Iterator[bytes]:
    """The uncompressed archive of ``manifest``'s files under ``root``, in chunks;
    ``progress(done, files)`` after each file. Each file is digested again as it is read:
    one that changed since ``scan`` raises ``ArtifactError`` (the caller's upload is then
    abandoned, never completed)."""
    data = manifest.encode()
    yield _header(MANIFEST_NAME, len(data), 0o644) + data + _padding(len(data))
    for done, entry in enumerate(manifest.files, 1):
        yield _header(entry.path, entry.size, entry.mode)
        h, size = hashlib.sha256(), 0
        try:  # each component opened without following a link, as the scan did
            opened = open_file(root, entry.path)
        except OSError:
            opened = None
        if opened is None:
            raise ArtifactError(f"{entry.path} changed while it was uploaded")
        with os.fdopen(opened[0], "rb") as f:
            while size < entry.size and (chunk := f.read(min(CHUNK, entry.size - size))):
                h.update(chunk)
                size += len(chunk)
                yield chunk
        if size != entry.size or h.hexdigest() != entry.sha256:
            raise ArtifactError(f"{entry.path} changed while it was uploaded")
        yield _padding(entry.size)
        if progress is not None:
            progress(done, len(manifest.files))
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
    progress: Callable[[int, int], None] | None = None,
    factors: Mapping[str, object] | None = None,
) -> tuple[Manifest, Iterator[bytes]]:
    """The bundle of ``files`` (from ``scan_cache(root)``) of cache ``kind`` valid in
    ``scope`` (``factors``: those it hashes, kept as the manifest's labels, for people),
    signed when ``keyring`` can sign, and its stream (as ``pack``'s; ``progress`` as
    ``tar_chunks``')."""
    manifest = Manifest(
        scope, "", tuple(files), producer=producer or {}, labels=dict(factors or {}), kind=kind
    )
    return _signed_stream(root, manifest, keyring, compress, progress)


def _signed_stream(
    root: Path,
    manifest: Manifest,
    keyring: Keyring,
    compress: bool,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Manifest, Iterator[bytes]]:
    manifest = manifest.signed_with(keyring)
    chunks = tar_chunks(root, manifest, progress)
    if compress and zstd_available():
        chunks = compressed(chunks)
    return manifest, chunks
