"""The guarded handle: the one way plancache touches a directory another local user could
write (a cache root of Triton, Inductor or vLLM, the local tier, the explain, marks,
crash-mark and verdict directories, pull records, install targets).

A neighbour who may write such a directory (a hostPath with umask 002, a group that may
write ``TRITON_CACHE_DIR``) can plant a link, a FIFO or a file of their own under any name
plancache uses there, or swap a directory for a link between two calls. Below the anchor
(the configured directory, whose own path may hold links), a ``Directory`` holds:

- **descriptors, never paths**: each component is opened relative to its parent with
  ``O_NOFOLLOW`` (a link: ``OddFileError``), made with ``mkdir(dir_fd=)`` and judged on the
  ``fstat`` of what was made or found; names are resolved once, in a descriptor;
- **new files only**: written to a new name ``O_CREAT|O_EXCL|O_NOFOLLOW`` and renamed or
  linked into place by descriptors (``os.rename``/``os.link`` with ``src_dir_fd`` and
  ``dst_dir_fd``): a planted link at the temp or final name is never written through;
- **reads** as ``plancache._neighbours`` reads: regular files only, non-blocking, bounded,
  owner and mode judged on the descriptor read by the one foreign-writer rule
  (``plancache._neighbours.foreign``);
- **deletes** of the entry judged (device and inode), by descriptor.

No other module of ``plancache`` opens, makes, links, stats or unlinks below such a
directory (``tests/test_layout.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
from pathlib import Path

from plancache._neighbours import (
    DIRECTORY,
    MAX_DEPTH,
    Foreign,
    Read,
    foreign,
    open_at,
    open_below,
    parts,
    read_opened,
)

CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""Flags of every new file below a guarded directory."""


def fresh(prefix: str) -> str:
    """A name no other process picks: ``prefix``, this host, this pid and random bits (a
    directory may be shared across hosts)."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class Directory:
    """A directory another local user could write, held as one descriptor: the only way
    plancache touches what is below it. Every component below the anchor is opened relative
    to its parent with ``O_NOFOLLOW`` (a link there: ``OddFileError``), made with
    ``mkdir(dir_fd=)`` and judged on the ``fstat`` of what was made or found; new files are
    created ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a fresh name and renamed or linked into
    place by descriptors; reads are ``read_file``'s (regular files only, non-blocking,
    bounded); deletes unlink, by descriptor, the entry that was judged. ``foreign``: why
    another user could have written this directory or one on its way below the anchor (the
    one rule, ``foreign``)."""

    def __init__(self, fd: int, path: Path, foreign: Foreign | None) -> None:
        self.fd, self.path, self.foreign = fd, path, foreign

    @classmethod
    def open(cls, anchor: Path, relative: str = "") -> Directory | None:
        """The directory ``relative`` (``/``-separated, no ``..``; "" for the anchor) below
        ``anchor`` (the configured directory: its own path may hold links, and its own mode
        is the caller's to judge); None where absent. Raises ``OddFileError`` (a link or a
        file on the way) or ``OSError``."""
        return cls._open(anchor, relative, None)

    @classmethod
    def make(cls, anchor: Path, relative: str = "", *, mode: int = 0o777) -> Directory:
        """``open``, each directory absent below the anchor made with ``mode`` (less the
        umask, as ``mkdir`` makes it; the anchor and its parents, where absent, as
        ``os.makedirs`` makes them)."""
        made = cls._open(anchor, relative, mode)
        if made is None:  # the anchor is absent (a file there stays one: refused below)
            with contextlib.suppress(FileExistsError):
                os.makedirs(anchor)
            made = cls._open(anchor, relative, mode)
        if made is None:
            raise FileNotFoundError(errno.ENOENT, "absent or not a directory", str(anchor))
        return made

    @classmethod
    def _open(cls, anchor: Path, relative: str, mode: int | None) -> Directory | None:
        try:
            fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        top = cls(fd, anchor, None)
        if not relative:
            return top
        with top:
            return top.sub(relative, create=mode is not None, mode=mode or 0o777)

    def sub(self, relative: str, *, create: bool = False, mode: int = 0o777) -> Directory | None:
        """The directory ``relative`` below this one, each component opened (made, where
        absent and ``create``) as ``open`` says; a new handle, the caller closes it."""
        fd, where, why = self.fd, self.path, self.foreign
        try:
            for part in parts(relative):
                where = where / part
                child = open_at(fd, part, DIRECTORY, where)
                if child is None and create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, mode, dir_fd=fd)
                    child = open_at(fd, part, DIRECTORY, where)
                if fd != self.fd:
                    os.close(fd)
                fd = self.fd
                if child is None:
                    return None
                fd = child
                why = why or foreign(os.fstat(fd), f"directory {where}")
        except BaseException:
            if fd != self.fd:
                os.close(fd)
            raise
        return Directory(fd, where, why)

    def private(self, mode: int = 0o755) -> None:
        """Where this directory is this user's, take from its group and others what ``mode``
        does not grant them (the default: writing, as the one rule asks; a directory made
        under umask 002 is 0775), by descriptor; its ``foreign`` is judged again."""
        st = os.fstat(self.fd)
        taken = st.st_mode & 0o077 & ~mode
        if st.st_uid == os.geteuid() and taken:
            os.fchmod(self.fd, stat.S_IMODE(st.st_mode) & ~taken)
            st = os.fstat(self.fd)
        self.foreign = foreign(st, f"directory {self.path}")

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, name: str, limit: int) -> Read | None:
        """The regular file ``name`` here (or ``a/b`` below), read as ``read_file`` reads
        (``Read.foreign`` counts this directory's too); None where it is absent."""
        return read_opened(self.open_file(name), limit, self.path / name)

    def open_file(self, name: str) -> tuple[int, os.stat_result, Foreign | None] | None:
        """A read-only descriptor of the regular file ``name`` here (or ``a/b`` below), opened
        as ``read`` opens it, its ``fstat`` and why another user could have written it or
        this directory; None where absent. The caller closes it."""
        opened = open_below(self.fd, self.path, name)
        if opened is None or self.foreign is None:
            return opened
        return opened[0], opened[1], self.foreign

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name``'s own ``lstat`` (a link's, never its target's); None if absent."""
        try:
            return os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        """The names of the entries of this directory (read through its descriptor)."""
        return os.listdir(self.fd)

    def create(self, name: str, mode: int = 0o600) -> int:
        """A new file ``name`` here, open for writing (``O_CREAT|O_EXCL|O_NOFOLLOW``: never
        an entry already there, a link least of all); the caller closes it."""
        return os.open(name, CREATE, mode, dir_fd=self.fd)

    def temp(self, prefix: str, mode: int = 0o600) -> tuple[str, int]:
        """A new file under a fresh name starting with ``prefix`` (host, pid, random) and its
        descriptor open for writing (``create``)."""
        name = f"{fresh(prefix)}.tmp"
        return name, self.create(name, mode)

    def write(self, name: str, data: bytes, mode: int = 0o600, *, replace: bool = True) -> bool:
        """``data`` as the file ``name`` here, atomically: a ``temp`` file, then renamed over
        ``name`` (``replace``) or linked as it, create-if-absent (False: ``name`` was there,
        kept). Never writes through a link or over one's target."""
        temp, fd = self.temp(f".{name[:64]}.", mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.rename(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                return True
            return self.link(self, temp, name)
        finally:
            self.discard(temp)

    def link(self, source: Directory, name: str, as_name: str) -> bool:
        """Hard-link ``source``'s entry ``name`` here as ``as_name``, create-if-absent (False:
        an entry was there, kept); never through a link."""
        try:
            os.link(
                name,
                as_name,
                src_dir_fd=source.fd,
                dst_dir_fd=self.fd,
                follow_symlinks=False,
            )
        except FileExistsError:
            return False
        return True

    def rename(self, name: str, to: Directory, as_name: str) -> None:
        """Rename this directory's entry ``name`` to ``to``'s ``as_name`` (by descriptors)."""
        os.rename(name, as_name, src_dir_fd=self.fd, dst_dir_fd=to.fd)

    def remove(self, name: str, judged: os.stat_result) -> bool:
        """Remove the entry ``name`` if it is still the one ``judged`` (device and inode);
        False if it is gone or another one."""
        now = self.lstat(name)
        if now is None or (now.st_dev, now.st_ino) != (judged.st_dev, judged.st_ino):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)
        return True

    def discard(self, name: str) -> None:
        """Remove this process's own temp file ``name`` here (made by ``temp``: no other
        process picks its name), by descriptor; nothing where it is gone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def make_temp(self, prefix: str) -> tuple[str, Directory]:
        """A new private (0700) directory here under a fresh name starting with ``prefix``
        (host, pid, random): its name and handle."""
        name = fresh(prefix)
        os.mkdir(name, 0o700, dir_fd=self.fd)
        made = self.sub(name)
        if made is None:
            raise FileNotFoundError(errno.ENOENT, "removed as it was made", str(self.path / name))
        return name, made

    def remove_tree(self, name: str) -> None:
        """Remove the directory ``name`` here and all below it, by descriptors, never
        following a link (a link is unlinked, not entered), at most ``MAX_TREE_DEPTH``
        directories deep; errors ignored (what could not be removed stays). Not
        ``shutil.rmtree(dir_fd=)``, which raises where a program wrapped ``os.unlink``."""
        with contextlib.suppress(OSError):
            _remove_tree(self.fd, name, MAX_TREE_DEPTH)


MAX_TREE_DEPTH = 2 * MAX_DEPTH
"""Most directories below one that ``Directory.remove_tree`` enters (an install is refused
past ``MAX_DEPTH``)."""


def _remove_tree(parent: int, name: str, depth: int) -> None:
    """``Directory.remove_tree``'s walk: ``name`` below the descriptor ``parent``."""
    fd = os.open(name, DIRECTORY, dir_fd=parent)
    try:
        with os.scandir(fd) as listed:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in listed]
        for child, is_dir in entries:
            with contextlib.suppress(OSError):
                if is_dir and depth > 0:
                    _remove_tree(fd, child, depth - 1)
                elif not is_dir:
                    os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


class Below:
    """Handles of the directories below one ``Directory`` that paths in order name: the last
    one opened (``Directory.sub``, made where absent if ``create``) is kept for the next
    path in the same directory; closed with this."""

    def __init__(self, top: Directory, *, create: bool = False, mode: int = 0o777) -> None:
        self.top, self.create, self.mode = top, create, mode
        self._last: tuple[str, Directory | None] | None = None

    def __call__(self, relative: str) -> Directory:
        """The directory of the file ``relative`` (``a/b/name``: ``a/b``; ``name``: the top).
        Raises ``FileNotFoundError`` where absent (not ``create``), ``OddFileError`` for a
        link on the way, else ``OSError``."""
        parent = relative.rpartition("/")[0]
        if not parent:
            return self.top
        if self._last is None or self._last[0] != parent:
            self.close()
            self._last = (parent, self.top.sub(parent, create=self.create, mode=self.mode))
        held = self._last[1]
        if held is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(self.top.path / parent))
        return held

    def close(self) -> None:
        if self._last is not None and self._last[1] is not None:
            self._last[1].close()
        self._last = None

    def __enter__(self) -> Below:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
