"""Verify an artifact or bundle stream (``packing`` writes them) and install it (local I/O).

Guarantees: ``install`` never writes outside the target directory and never installs an
unverified byte: it reads the manifest first (checked, then judged by the caller's
``accept`` before any file is written: a refusal raises ``trust.Refused``), writes each file
into a private temp directory below the target (``O_EXCL``, ``O_NOFOLLOW``, mode 0o644/0o755
only), checks its size and sha256, and requires the archive to end right after the last
entry. Only then are the files moved in: each ``inductor_cache/`` file by a hard link
(create-if-absent: a file already there is kept), then the rank directory by one ``rename``
(vLLM looks for ``<rank>/model``, which therefore appears only with all its kernels in
place). Any failure removes the temp directory: a tampered, truncated or foreign stream
leaves the target as it was. Memory does not grow with the artifact's size (``CHUNK``).

A cache bundle (``install_cache``) is verified the same way, and its files are moved in one
by one, each create-if-absent (a file the node has is kept). Triton's group files
(``__grp__<name>.json``: a kernel is visible to Triton only through one, and it lists its
files by absolute path, the producer's) go last, re-rooted: each child path names the file
of the same name beside the group file, where this node keeps it (``regroup``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, cast

import orjson

from plancache._artifacts.manifest import (
    COMPILE,
    DEFAULT_MAX_BYTES,
    INDUCTOR_DIR,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_PATH_CHARS,
    FileEntry,
    Manifest,
    Readable,
    check_path,
)
from plancache._artifacts.packing import BLOCK, CHUNK
from plancache._artifacts.trust import Refused, refused
from plancache._defaults import STALE_INSTALL_S
from plancache._directory import Below, Directory
from plancache._neighbours import OddFileError
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import ArtifactError as ArtifactError  # raised here, named there
from plancache.errors import InvalidPlanError, UnreadableHereError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GROUP_PREFIX = "__grp__"
"""Triton's group files (``FileCacheManager.put_group``), in Triton's and Inductor's caches."""
MAX_GROUP_BYTES = 1 << 20
MAX_EXTENDED_BYTES = MAX_PATH_CHARS + 16
"""Bytes of an extended header: one path record of at most ``MAX_PATH_CHARS``."""
INSTALLED_MANIFEST = ".plancache-manifest.json"
"""A copy of the manifest kept in an installed rank directory (names what was installed)."""
TEMP_PREFIX = ".plancache-tmp-"


class _Stream:
    """A stream with a pushback buffer: ``read`` (what is there, at most ``n``, for a
    decompressor) and ``exact`` (exactly ``n`` bytes, ``ArtifactError`` if it ends)."""

    def __init__(self, source: Readable) -> None:
        self.source = source
        self.buffer = b""

    def read(self, n: int = CHUNK) -> bytes:
        if self.buffer:
            data, self.buffer = self.buffer[:n], self.buffer[n:]
            return data
        return self.source.read(n)

    def exact(self, n: int) -> bytes:
        parts, have = [], 0
        while have < n:
            chunk = self.read(max(n - have, CHUNK))
            if not chunk:
                raise ArtifactError("artifact stream ended early (truncated)")
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.buffer = data[n:] + self.buffer
        return data[:n]


def _decompressing(source: Readable) -> _Stream:
    raw = _Stream(source)
    head = raw.exact(4)
    raw.buffer = head + raw.buffer
    if head != ZSTD_MAGIC:
        return raw
    try:
        import zstandard
    except ImportError:
        raise UnreadableHereError(
            "artifact is zstd-compressed and zstandard is not installed here "
            "(a dependency of plancache since 0.4.0: pip install 'zstandard>=0.22')"
        ) from None
    reader = zstandard.ZstdDecompressor().stream_reader(cast(IO[bytes], raw))  # reads by read()
    return _Stream(_Unzstd(reader, zstandard.ZstdError))


class _Unzstd:
    """A zstd stream reader whose decoding errors are ``ArtifactError`` (corrupt data)."""

    def __init__(self, reader: Readable, error: type[Exception]) -> None:
        self.reader, self.error = reader, error

    def read(self, n: int, /) -> bytes:
        try:
            return self.reader.read(n)
        except self.error as exc:
            raise ArtifactError(f"artifact stream is corrupt: {exc}") from None


def _header(stream: _Stream) -> tarfile.TarInfo:
    block = stream.exact(BLOCK)
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "strict")
    except tarfile.EOFHeaderError:  # type: ignore[attr-defined]
        raise ArtifactError("artifact archive ends before its last file") from None
    except (tarfile.HeaderError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"artifact archive header is malformed: {exc}") from None


def _extended_path(stream: _Stream, size: int) -> str:
    """The path a POSIX extended header of ``size`` bytes holds: one ``path`` record and
    nothing else (no link, owner or time of a producer's is ever taken), a safe relative
    path (``check_path``); else ``ArtifactError``."""
    if size > MAX_EXTENDED_BYTES:
        raise ArtifactError(
            f"artifact extended header of {size} bytes (at most {MAX_EXTENDED_BYTES})"
        )
    data = stream.exact(size)
    stream.exact(-size % BLOCK)
    length, _, record = data.partition(b" ")
    key, _, value = record.partition(b"=")
    if not (length.isdigit() and int(length) == size and key == b"path" and value.endswith(b"\n")):
        raise ArtifactError("artifact extended header holds something other than one path")
    try:
        return check_path(value[:-1].decode("utf-8", "strict"), "")
    except (InvalidPlanError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"artifact extended header: {exc}") from None


def _member(stream: _Stream) -> tarfile.TarInfo:
    """The next member's header: a regular file of a ustar archive, its path in an extended
    header where ustar could not hold it (nothing else is read)."""
    info = _header(stream)
    if info.type == tarfile.XHDTYPE:
        path = _extended_path(stream, info.size)
        info = _header(stream)
        info.name = path
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise ArtifactError(f"artifact member {info.name!r:.60} is not a regular file")
    return info


def read_manifest(
    source: Readable, *, max_bytes: int = DEFAULT_MAX_BYTES, keyring: Keyring = NO_KEYS
) -> Manifest:
    """The manifest at the head of an artifact stream (the rest is not read); where
    ``keyring`` requires signatures, an unsigned one is refused before it is parsed
    (``Manifest.decode``)."""
    return _read_manifest(_decompressing(source), max_bytes, keyring)


def _read_manifest(stream: _Stream, max_bytes: int, keyring: Keyring) -> Manifest:
    info = _member(stream)
    if info.name != MANIFEST_NAME or info.size > MAX_MANIFEST_BYTES:
        raise ArtifactError("artifact stream does not start with its manifest")
    data = stream.exact(info.size)
    stream.exact(-info.size % BLOCK)
    try:
        return Manifest.decode(data, max_bytes=max_bytes, keyring=keyring)
    except InvalidPlanError as exc:
        raise ArtifactError(f"artifact manifest is invalid: {exc}") from None


def install(
    source: Readable,
    target: Path,
    key: str,
    rank: str,
    *,
    accept: Callable[[Manifest], Refused | str | None],
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Callable[[int], None] | None = None,
    proceed: Callable[[], bool] = lambda: True,
    keyring: Keyring = NO_KEYS,
) -> Manifest | None:
    """Verify the artifact stream ``source`` and install it into ``target`` (vLLM's ``<key>``
    directory), as the module docstring says. ``accept(manifest)`` returns None to go on, or
    the refusal (``Refused``, or a reason as text: raised as ``Refused``); where ``keyring``
    requires signatures an unsigned manifest is refused before it is parsed. Returns the
    manifest installed, or None when the rank directory was already there (another process
    installed or compiled it: kept). Raises
    ``ArtifactError`` (nothing installed) for anything else: among them what ``progress``
    (called with each chunk's size as the files are extracted) raises, and ``proceed()``
    False once every file is verified (the caller stopped waiting for it)."""
    expected = (COMPILE, key, rank)
    with _verified(source, target, expected, accept, max_bytes, keyring, progress) as (
        manifest,
        root,
        temp,
    ):
        with Below(temp, create=True) as below:
            fd = below(f"{rank}/{INSTALLED_MANIFEST}").create(INSTALLED_MANIFEST, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(manifest.encode())
        if not proceed():
            raise ArtifactError("the boot stopped waiting for it: not installed")
        return manifest if _move_in(temp, root, manifest) else None


def install_cache(
    source: Readable,
    root: Path,
    kind: str,
    scope: str,
    *,
    accept: Callable[[Manifest], Refused | str | None],
    max_bytes: int = DEFAULT_MAX_BYTES,
    keyring: Keyring = NO_KEYS,
    placed: Callable[[FileEntry, str], None] = lambda entry, outcome: None,
) -> tuple[Manifest, int]:
    """Verify the cache bundle ``source`` (of ``kind`` in ``scope``) and install its files
    below ``root``, each create-if-absent, group files last and re-rooted (see the module
    docstring). Returns the manifest and how many files this call installed; raises
    ``ArtifactError`` (nothing installed) as ``install`` does. ``placed(entry, outcome)``
    says what became of each file: ``installed``; ``same``: the node had it there with the
    bytes the bundle's would have been (a group file: once re-rooted), kept; ``differing``:
    the node had other bytes there, or something that is not a regular file (a link on the
    way too), kept as it is and never followed."""
    expected = (kind, scope, "")
    with (
        _verified(source, root, expected, accept, max_bytes, keyring) as (manifest, top, temp),
        Below(temp) as extracted,
        Below(top, create=True) as into,
    ):
        installed = 0
        for entry in sorted(manifest.files, key=lambda e: is_group_file(e.path)):
            name = entry.path.rpartition("/")[2]
            try:
                dest = into(entry.path)
            except OddFileError:  # a link or a file where a directory goes: never followed
                placed(entry, "differing")
                continue
            held = extracted(entry.path)
            if is_group_file(entry.path) and not regroup(held, name, dest.path):
                continue  # not a group Triton wrote: its kernel stays invisible (compiled)
            if dest.link(held, name, name):
                installed += 1
                placed(entry, "installed")
            else:
                same = same_file(dest, held, name) or (
                    is_group_file(entry.path) and same_group(dest, held, name)
                )
                placed(entry, "same" if same else "differing")
        return manifest, installed


def same_file(one: Directory, other: Directory, name: str) -> bool:
    """True where the regular files ``name`` of ``one`` and of ``other`` hold the same bytes
    (sizes first, then the bytes, in chunks); False for other bytes, or for anything there
    that is not a regular file (never followed nor waited on)."""
    with contextlib.ExitStack() as stack:
        held = []
        for directory in (one, other):
            try:
                opened = directory.open_file(name)
            except OSError:
                return False
            if opened is None:
                return False
            stack.callback(os.close, opened[0])
            held.append(opened)
        (a, st_a, _), (b, st_b, _) = held
        if st_a.st_size != st_b.st_size:
            return False
        while chunk := os.read(a, CHUNK):
            if os.read(b, len(chunk)) != chunk:
                return False
        return not os.read(b, 1)


def same_group(one: Directory, other: Directory, name: str) -> bool:
    """True where the group files ``name`` of ``one`` and ``other`` list the same children
    at the same paths (Triton and ``regroup`` space their JSON apart)."""
    try:
        a, b = one.read(name, MAX_GROUP_BYTES), other.read(name, MAX_GROUP_BYTES)
        return a is not None and b is not None and orjson.loads(a.data) == orjson.loads(b.data)
    except (OSError, ValueError):
        return False


def is_group_file(path: str) -> bool:
    """True for a Triton group file's path."""
    return path.rsplit("/", 1)[-1].startswith(GROUP_PREFIX)


def regroup(directory: Directory, name: str, where: Path) -> bool:
    """Rewrite the group file ``name`` of ``directory`` (a new file under its name) so that
    each child path names the file of the same name in ``where``; False if it is not a
    group file as Triton writes it."""
    try:
        read = directory.read(name, MAX_GROUP_BYTES)
        if read is None:
            return False
        data = orjson.loads(read.data)
        children = data["child_paths"]
        if not isinstance(children, dict) or set(data) != {"child_paths"}:
            return False
        rooted = {}
        for child, path in children.items():
            base = os.path.basename(str(path))
            if base != check_path(child, ""):
                return False
            rooted[child] = str(where / base)
    except (OSError, ValueError, KeyError, TypeError, InvalidPlanError):
        return False
    directory.remove(name, read.st)
    with os.fdopen(directory.create(name, stat.S_IMODE(read.st.st_mode)), "wb") as f:
        f.write(orjson.dumps({"child_paths": rooted}))
    return True


@contextlib.contextmanager
def _verified(
    source: Readable,
    target: Path,
    expected: tuple[str, str, str],
    accept: Callable[[Manifest], Refused | str | None],
    max_bytes: int,
    keyring: Keyring,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[Manifest, Directory, Directory]]:
    """The manifest of ``source`` (its (kind, key, rank) ``expected``; accepted), the guarded
    handle of ``target`` (made where absent) and that of a private temp directory in it
    holding every file the manifest lists, verified; the temp directory is removed
    afterwards."""
    stream = _decompressing(source)
    manifest = _read_manifest(stream, max_bytes, keyring)
    if (manifest.kind, manifest.key, manifest.rank) != expected:
        raise ArtifactError(f"foreign artifact: it is {manifest.key[:12]}/{manifest.rank}")
    reason = accept(manifest)
    if reason is not None:
        raise refused(reason)
    with Directory.make(target) as root:
        name, temp = root.make_temp(TEMP_PREFIX)
        try:
            with temp, Below(temp, create=True, mode=0o755) as below:
                for entry in manifest.files:
                    _extract(stream, below, entry, progress)
                if stream.exact(2 * BLOCK) != b"\0" * (2 * BLOCK):
                    raise ArtifactError("artifact archive holds more than its manifest lists")
                below.close()
                yield manifest, root, temp
        finally:
            root.remove_tree(name)


def partial_installs(target: Path, older_than: float = STALE_INSTALL_S) -> list[Path]:
    """The temp directories that installs into ``target`` (vLLM's ``<key>`` directory: its
    artifacts, and the bundles installed into its ``inductor_cache``; a generated cache's
    root) left more than ``older_than`` seconds ago: their boots were killed mid-install."""
    return [where.path / name for where, name in _partial(target, older_than, remove=False)]


def _partial(target: Path, older_than: float, *, remove: bool) -> list[tuple[Directory, str]]:
    """(directory, name) of each partial install, listed through the guarded handles of
    ``target`` and its ``inductor_cache`` (never a link followed); removed if ``remove``."""
    cutoff = time.time() - older_than
    out = []
    for relative in ("", INDUCTOR_DIR):
        try:
            where = Directory.open(target, relative)
        except OSError:
            continue
        if where is None:
            continue
        with where:
            for name in where.names():
                st = where.lstat(name) if name.startswith(TEMP_PREFIX) else None
                if st is not None and stat.S_ISDIR(st.st_mode) and st.st_mtime <= cutoff:
                    out.append((where, name))
                    if remove:
                        where.remove_tree(name)
    return out


def remove_partial_installs(
    target: Path, older_than: float = STALE_INSTALL_S, *, dry_run: bool = False
) -> int:
    """Remove what ``partial_installs`` finds; how many were (or would be) removed."""
    return len(_partial(target, older_than, remove=not dry_run))


def compile_cache(vllm_cache_root: Path) -> Path:
    """Where vLLM keeps its AOT compile artifacts, one ``<key>`` directory each."""
    return vllm_cache_root / "torch_compile_cache" / "torch_aot_compile"


def _extract(
    stream: _Stream, below: Below, entry: FileEntry, progress: Callable[[int], None] | None
) -> None:
    info = _member(stream)
    if info.name != entry.path or info.size != entry.size:
        raise ArtifactError(f"artifact member {info.name!r:.60} is not the manifest's next file")
    fd = below(entry.path).create(entry.path.rpartition("/")[2], 0o600)
    h, left = hashlib.sha256(), entry.size
    with os.fdopen(fd, "wb") as f:
        while left:
            chunk = stream.exact(min(CHUNK, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
            if progress is not None:
                progress(len(chunk))
        os.fchmod(f.fileno(), entry.mode)
    if h.hexdigest() != entry.sha256:
        raise ArtifactError(f"{entry.path}: content does not match its digest (tampered)")
    stream.exact(-entry.size % BLOCK)


def _move_in(temp: Directory, root: Directory, manifest: Manifest) -> bool:
    """Kernels first (each one create-if-absent; none below a planted link), the rank
    directory last, in one rename. False if the rank directory was already there."""
    with Below(temp) as extracted, Below(root, create=True) as into:
        for entry in manifest.files:
            if not entry.path.startswith(f"{INDUCTOR_DIR}/"):
                continue
            name = entry.path.rpartition("/")[2]
            with contextlib.suppress(OddFileError):
                into(entry.path).link(extracted(entry.path), name, name)
    try:
        temp.rename(manifest.rank, root, manifest.rank)
    except OSError:
        if _has_model(root, manifest.rank):
            return False
        raise
    return True


def _has_model(root: Directory, rank: str) -> bool:
    """True if the rank directory ``rank`` of ``root`` holds vLLM's ``model``."""
    try:
        held = root.sub(rank)
    except OSError:
        return False
    if held is None:
        return False
    with held:
        return held.lstat("model") is not None


def installed_manifest(rank_dir: Path) -> Manifest | None:
    """The manifest plancache left in an installed rank directory, or None."""
    try:
        return Manifest.decode((rank_dir / INSTALLED_MANIFEST).read_bytes())
    except (OSError, InvalidPlanError):
        return None
