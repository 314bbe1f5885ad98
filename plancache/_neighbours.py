"""Files another local user could have written, read one way (no I/O libraries).

A node's directories can be shared: a hostPath with umask 002, a group that may write
``VLLM_CACHE_ROOT`` or ``TRITON_CACHE_DIR``. Every read here of such a file (the cached
conformance verdicts, the local tier's marks and the records they point to) holds:

- **regular files only**: each component below the anchor (a configured directory, whose
  own path may be a link) is opened relative to its parent's descriptor with
  ``O_NOFOLLOW`` (``ODIRECTORY`` for a directory, ``O_NONBLOCK`` for the file): a link,
  FIFO, device or socket is refused (``OddFileError``), never followed or waited on;
- **judged on what was opened**: the ``fstat`` of each descriptor, never a path re-resolved
  after it was judged, says whether another user could have written it (``foreign``: owned
  by a user other than this one or root, or writable by its group or others), every
  directory below the anchor on the way and the file alike (the anchor is the
  configuration's: a neighbour who may write it can replace what it holds, never with a
  directory or file owned by this user);
- **bounded**: at most ``limit`` bytes are read (a longer file is refused, ``limit + 1``
  bytes read).

What a foreign file is worth is the caller's decision (a verdict, a mark: nothing; a signed
record: its signature), made from ``Read.foreign``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from plancache.errors import PlancacheError

NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""Flags of every open of a file another user could have written."""
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OddFileError(PlancacheError, OSError):
    """A path that is not a regular file where one was expected, or one over the limit (an
    ``OSError`` too: callers that handle a file's failures handle it)."""


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a regular file", "a FIFO", ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class Foreign(str):
    """Why users other than this one (or root) could have written a file or directory: the
    message, and which writers the one rule found (``owner``: the uid owning it where that is
    another user's; ``group_only``: this user's, and its group's write bit the only reason)."""

    owner: int | None
    group_only: bool

    def __new__(cls, why: str, owner: int | None = None, group_only: bool = False) -> Foreign:
        made = super().__new__(cls, why)
        made.owner, made.group_only = owner, group_only
        return made


def foreign(st: os.stat_result, what: str) -> Foreign | None:
    """THE foreign-writer rule, the only one in plancache: why users other than this one (or
    root) could have written ``what`` (its ``fstat``: owned by another user, or writable by
    its group or others); None if none could."""
    if st.st_uid not in (os.geteuid(), 0):
        return Foreign(f"{what} is owned by uid {st.st_uid}", owner=st.st_uid)
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        return Foreign(
            f"{what} is writable by its group or others (mode {mode:04o})",
            group_only=not st.st_mode & 0o002,
        )
    return None


def uploadable(why: Foreign | None) -> bool:
    """True where an upload may sign and ship a file of this node's own caches that the one
    rule judged ``why``: no other user could have written it, or only its group could (a
    file this user made under umask 002: a group member who could change it could change
    what this node loads itself)."""
    return why is None or why.group_only


@dataclass(frozen=True)
class Read:
    """A file read: its bytes, its ``fstat``, and why another user could have written it or
    a directory on its way (None: no one could)."""

    data: bytes
    st: os.stat_result
    foreign: Foreign | None


@contextlib.contextmanager
def _opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_at(parent: int, name: str, flags: int, where: Path) -> int | None:
    """``name`` opened in directory ``parent`` with ``flags`` (``NO_FOLLOW`` among them);
    None if absent. Raises ``OddFileError`` for a link, or a FIFO or device where the flags
    refuse it, else ``OSError``."""
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            raise
        try:
            st = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return None
        raise OddFileError(errno.EINVAL, f"{kind(st.st_mode)}, not opened", str(where)) from None


def parts(relative: str) -> list[str]:
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a relative path below the anchor: {relative!r}")
    return parts


def open_file(anchor: Path, relative: str) -> tuple[int, os.stat_result, Foreign | None] | None:
    """A read-only descriptor of the regular file at ``relative`` (``/``-separated, no
    ``..``) below the directory ``anchor``, its ``fstat``, and why another user could have
    written it or a directory below the anchor on its way (None: no one could); None if it
    or a directory on its way is absent. The caller closes the descriptor. Raises
    ``OddFileError`` (not a regular file, a link on the way) or ``OSError``."""
    try:
        fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with _opened(fd):
        return open_below(fd, anchor, relative)


def open_below(
    top: int, where: Path, relative: str
) -> tuple[int, os.stat_result, Foreign | None] | None:
    """``open_file`` from the directory descriptor ``top`` (of ``where``), left open."""
    names = parts(relative)
    fd, why = top, None
    try:
        for i, part in enumerate(names):
            where = where / part
            last = i == len(names) - 1
            child = open_at(fd, part, os.O_RDONLY | NO_FOLLOW if last else DIRECTORY, where)
            if fd != top:
                os.close(fd)
            fd = top
            if child is None:
                return None
            fd = child
            if not last:
                why = why or foreign(os.fstat(fd), f"directory {where}")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OddFileError(errno.EINVAL, f"{kind(st.st_mode)}, not a regular file", str(where))
    except BaseException:
        if fd != top:
            os.close(fd)
        raise
    return fd, st, why or foreign(st, f"file {where}")


def read_file(anchor: Path, relative: str, limit: int) -> Read | None:
    """The file ``open_file`` opens, read: at most ``limit`` bytes (more: ``OddFileError``);
    None where it is absent."""
    return read_opened(open_file(anchor, relative), limit, anchor / relative)


def read_followed(path: Path, limit: int, what: str = "it") -> Read:
    """The file at ``path`` read as ``read_file`` reads, but following links, every one of
    them (a secret Kubernetes mounts through links: a key file): opened without blocking,
    a regular file only (else ``OddFileError``, never waited on), at most ``limit`` bytes
    (more: ``OddFileError``, ``EFBIG``), judged on the ``fstat`` of the descriptor read by
    the one rule (``Read.foreign``, naming the file ``what``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OddFileError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    read = read_opened((fd, st, foreign(st, what)), limit, path)
    assert read is not None
    return read


def read_opened(
    opened: tuple[int, os.stat_result, Foreign | None] | None, limit: int, where: Path
) -> Read | None:
    if opened is None:
        return None
    fd, st, why = opened
    with _opened(fd):
        data = _read(fd, limit + 1)
    if len(data) > limit:
        raise OddFileError(errno.EFBIG, f"over {limit} bytes", str(where))
    return Read(data, st, why)


@dataclass(frozen=True)
class Entry:
    """A file a walk found: its path below the anchor, the descriptor of its directory
    (valid until the walk goes on), its name there and its ``lstat``."""

    path: str
    dir_fd: int
    name: str
    st: os.stat_result


MAX_DEPTH = 32
"""Directories deeper below the anchor than this are not walked."""


def walk(
    anchor: Path, skip: Callable[[str, bool], bool] = lambda name, directory: False
) -> Iterator[Entry]:
    """Every entry below the directory ``anchor`` that is not a directory (links, FIFOs and
    devices too: ``open_entry`` refuses them), in path order, by directory descriptors:
    each directory is opened relative to its parent's with ``O_NOFOLLOW`` and must be the
    one its parent listed (device and inode), else it is not walked; entries ``skip``
    accepts (``skip(name, is_directory)``) are left out; a directory deeper than
    ``MAX_DEPTH`` is yielded itself (its ``lstat`` says so), not walked, for the caller to
    count. Yields nothing where ``anchor`` is absent."""
    try:
        fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    with _opened(fd):
        yield from _walk(fd, "", 0, skip)


def _walk(fd: int, prefix: str, depth: int, skip: Callable[[str, bool], bool]) -> Iterator[Entry]:
    for name in sorted(os.listdir(fd)):
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            continue
        if skip(name, stat.S_ISDIR(st.st_mode)):
            continue
        path = f"{prefix}{name}"
        if not stat.S_ISDIR(st.st_mode) or depth >= MAX_DEPTH:
            yield Entry(path, fd, name, st)
            continue
        try:
            child = os.open(name, DIRECTORY, dir_fd=fd)
        except OSError:  # gone, or swapped for a link or a file since it was listed
            continue
        with _opened(child):
            held = os.fstat(child)
            if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino):
                yield from _walk(child, f"{path}/", depth + 1, skip)


def open_entry(entry: Entry) -> int:
    """A read-only descriptor of the regular file ``entry`` names, the one the walk listed
    (device and inode); the caller closes it. Raises ``OddFileError`` (a link, a FIFO, a
    device, another file swapped in), ``FileNotFoundError`` (gone) or ``OSError``."""
    where = Path(entry.path)
    fd = open_at(entry.dir_fd, entry.name, os.O_RDONLY | NO_FOLLOW, where)
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "gone since it was listed", entry.path)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OddFileError(errno.EINVAL, f"{kind(st.st_mode)}, not a regular file", entry.path)
    if (st.st_dev, st.st_ino) != (entry.st.st_dev, entry.st.st_ino):
        os.close(fd)
        raise OddFileError(errno.EINVAL, "another file than the one listed", entry.path)
    return fd


def _read(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of ``fd``, to its end."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.read(fd, min(limit - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
