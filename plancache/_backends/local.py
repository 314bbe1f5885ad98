"""A local (or shared) directory as an object layer, atomic.

Every write goes through the directory's guarded handle (``plancache._directory.Directory``:
the directory opened once, each step by its descriptor). Create: write a temp file
``O_EXCL`` under a fresh name in the same directory, fsync it, link it to the final name
(atomic; fails if the name exists), fsync the directory. Replace: under an ``flock`` on a
sidecar lock file, check that the object is still the version read, then rename it over the
object; a conditional delete checks it under the same lock, then unlinks the entry judged.
The version
token of a read is the bytes read; that of a stream (``open_object``) is the file's identity
(device, inode, size, times), since a replace renames a new file into place.
Temp files are removed on every path; ones left by killed writers are removed by
:meth:`LocalStore.remove_stale_temp_files`.

Odd entries: only regular files are read, never followed or waited on (``O_NOFOLLOW``,
``O_NONBLOCK``, then ``fstat``). A symbolic link, FIFO, socket or directory named like a plan
is an invalid entry (``get`` raises ``InvalidPlanError`` saying what it is); it is listed,
``delete`` removes it, and a write replaces it.

Shared stores: the lock file is created mode 0o664 (less the umask) and opened read-only
(``flock`` needs no more), so every user who can read it can lock it; it is never followed
if it is a symbolic link. For a store several users write, make the directory group-owned
and setgid (``chmod 2775``) so that new files take its group, and give the writers a umask of
002. Lock waits are bounded by ``LocalStore.lock_timeout``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from plancache._defaults import STALE_TEMP_SECONDS, default_dir
from plancache._directory import Directory
from plancache._neighbours import NO_FOLLOW, foreign, kind
from plancache._objects import (
    CREATE,
    ObjectLayer,
    Opened,
    Update,
    WriteMode,
    check_name,
)
from plancache._store import READ_LIMIT
from plancache.errors import (
    InvalidPlanError,
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)

TEMP_SUFFIX = ".tmp"
TEMP_MODE = 0o644
LOCK_NAME = ".startup_plan.lock"
LOCK_MODE = 0o664
log = logging.getLogger("plancache")


def _odd(path: str) -> os.stat_result | None:
    """The ``lstat`` of ``path`` if it is there and not a regular file, else None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(st.st_mode) else st


def _is_at(path: str, held: os.stat_result) -> bool:
    """True while the file ``held`` (an ``fstat``) is the one at ``path``."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _remove(root: Directory, name: str) -> bool:
    """Remove the entry ``name`` of ``root`` whatever it is, as judged now (a directory with
    what it holds; links are removed, never followed), by descriptor; False if absent."""
    st = root.lstat(name)
    if st is None:
        return False
    if stat.S_ISDIR(st.st_mode):
        root.remove_tree(name)
        return True
    return root.remove(name, st)


def _read_at_most(fd: int, size: int, limit: int = READ_LIMIT) -> bytes:
    """At most ``limit`` bytes of ``fd``: in one read where the file still has the ``size``
    its ``fstat`` gave (a file that grew meanwhile reads as is), else to its end."""
    data = os.read(fd, size if 0 < size < limit else limit)
    if len(data) == size or not data:
        return data
    chunks, got = [data], len(data)
    while got < limit:
        chunk = os.read(fd, limit - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class _Partial:
    """A local object's version token when a read stopped at its limit: the bytes read (a
    whole read's token is its bytes themselves)."""

    data: bytes


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """A local object's version token when it is streamed: which file it is and its state."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def foreign_writers(directory: Directory, st: os.stat_result) -> str | None:
    """Why users other than this one (or root) could have written the file ``st`` (an
    ``fstat``) in ``directory`` (its guarded handle, judged on its own ``fstat``): the one
    foreign-writer rule (``plancache._neighbours.foreign``) on both; None if only this user
    or root could. The rule of every kind that is loaded as code."""
    return foreign(os.fstat(directory.fd), f"directory {directory.path}") or foreign(st, "its file")


def _store_error(path: Path, action: str, exc: OSError) -> PlanStoreError:
    message = f"{path}: cannot {action}: {exc.strerror or exc}"
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PlanStorePermissionError(message, cause=exc)
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return PlanStoreNotFoundError(message, cause=exc)
    return PlanStoreError(message, cause=exc)


class LocalStore(ObjectLayer):
    """Objects as files in one directory (created on first write); a plan is
    ``startup_plan_{fp}.json``."""

    #: Seconds a replace or delete waits at most for another process's lock.
    lock_timeout: float = 5.0

    #: Read only files no other user could have written: one owned by another user, or
    #: writable by its group or others (``plancache._neighbours.foreign``, judged on the
    #: descriptor read), is refused as an ``InvalidPlanError`` (``own``).
    only_own: bool = False

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        path = default_dir() if root is None else Path(root)
        self.root = Path(os.path.abspath(os.path.expanduser(path)))
        self._root = str(self.root)
        self._dir = self._root.rstrip("/") + "/"  # where plan files are named (root "/" too)

    def own(self) -> LocalStore:
        """This directory, reading only what no other user could have written (``only_own``):
        what this node offers as its own."""
        mine = LocalStore(self.root)
        mine.only_own = True
        return mine

    @property
    def url(self) -> str:
        return str(self.root)

    def local_directory(self) -> Path:
        return self.root

    # -- the object layer -----------------------------------------------------------------
    def _open_regular(
        self, name: str, at: Directory | None = None
    ) -> tuple[int, os.stat_result] | None:
        """A read-only descriptor of the regular file ``name`` (opened in ``at``, the root's
        handle, where given) and its ``fstat`` (never following a link or waiting on a
        FIFO); None if absent. Raises ``InvalidPlanError`` for an entry that is not a
        regular file."""
        path = self._dir + check_name(name)
        try:
            if at is None:
                fd = os.open(path, os.O_RDONLY | NO_FOLLOW)
            else:
                fd = os.open(name, os.O_RDONLY | NO_FOLLOW, dir_fd=at.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None
            odd = _odd(path) if exc.errno in (errno.ELOOP, errno.ENXIO) else None
            if odd is not None:
                raise InvalidPlanError(
                    f"{path} is {kind(odd.st_mode)}, not a stored object"
                ) from None
            raise _store_error(Path(path), "read", exc) from exc
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise _store_error(Path(path), "read", exc) from exc
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise InvalidPlanError(f"{path} is {kind(st.st_mode)}, not a stored object")
        why = foreign(st, f"file {path}") if self.only_own else None
        if why is not None:
            os.close(fd)
            raise InvalidPlanError(f"not read: {why}")
        return fd, st

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        """The bytes read are their own version token (no hash on every read)."""
        opened = self._open_regular(name)
        if opened is None:
            return None
        fd, st = opened
        try:
            data = _read_at_most(fd, st.st_size, limit)
        except OSError as exc:
            raise _store_error(self.root / name, "read", exc) from exc
        finally:
            os.close(fd)
        return data, (data if len(data) < limit else _Partial(data))

    def open_object(self, name: str) -> Opened | None:
        """The version token is the file's identity (device, inode, size, times): a replace
        renames a new file into place. ``Opened.foreign`` says who else could have written
        it (``foreign_writers``), the directory judged on the descriptor the file was opened
        in."""
        try:
            root = Directory.open(self.root)
        except OSError as exc:
            raise _store_error(self.root, "read", exc) from exc
        if root is None:
            return None
        with root:
            opened = self._open_regular(name, root)
            if opened is None:
                return None
            fd, st = opened
            return Opened(os.fdopen(fd, "rb"), _identity(st), foreign_writers(root, st))

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        """Create: a temp file then ``link`` (an entry that is not a regular file, e.g. a
        dangling link or a FIFO, is replaced). Update: under the lock, renamed over the
        object. Every step by the directory's descriptor (``Directory``)."""
        path = self.root / check_name(name)
        with self._directory(create=True) as root:
            tmp = self._write_temp(root, name, chunks)
            try:
                if isinstance(mode, Update):
                    with self._locked() as still_locked:
                        if not self._is_version(name, mode.version) or not still_locked():
                            return False
                        root.rename(tmp, root, name)
                else:
                    for _ in range(2):
                        if root.link(root, tmp, name):
                            break
                        if not self._remove_odd(root, name):
                            return False
                    else:
                        return False
            except OSError as exc:
                raise _store_error(path, "write", exc) from exc
            finally:
                root.discard(tmp)
            self._sync(root)
        return True

    def delete_object(self, name: str, version: object | None = None) -> bool:
        """Without ``version``, removes whatever entry has the name (links are not
        followed)."""
        path = self.root / check_name(name)
        if not os.path.lexists(path):
            return False
        with self._directory() as root, self._locked() as still_locked:
            if version is not None and (not self._is_version(name, version) or not still_locked()):
                return False
            try:
                if not _remove(root, name):
                    return False
            except OSError as exc:
                raise _store_error(path, "delete", exc) from exc
            self._sync(root)
        return True

    def list_objects(self, prefix: str) -> Iterator[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            raise _store_error(self.root, "list", exc) from exc
        return iter(sorted(n for n in names if n.startswith(prefix) and not n.startswith(".")))

    def _is_version(self, name: str, version: object) -> bool:
        """True if object ``name`` is still the one ``version`` names (its bytes, from
        ``read_object``, or its identity, from ``open_object``)."""
        if isinstance(version, (bytes, _Partial)):
            data = version.data if isinstance(version, _Partial) else version
            limit = len(data) if isinstance(version, _Partial) else len(data) + 1
            current = self.read_object(name, limit)
            return current is not None and current[0] == data
        try:
            return _identity(os.lstat(self.root / name)) == version
        except FileNotFoundError:
            return False

    def _write_temp(self, root: Directory, name: str, chunks: Iterable[bytes]) -> str:
        """A fsynced temp file in the store directory holding ``chunks`` (``O_EXCL`` under
        a fresh name, by the directory's descriptor), mode 0644; its name. The caller
        removes it (``Directory.discard``)."""
        try:
            tmp, fd = root.temp(f".{name}.", TEMP_MODE)
        except OSError as exc:
            raise _store_error(self.root, "create a temp file", exc) from exc
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), TEMP_MODE)  # whatever the umask, as before
        except OSError as exc:
            root.discard(tmp)
            raise _store_error(self.root / tmp, "write", exc) from exc
        except BaseException:
            root.discard(tmp)
            raise
        return tmp

    def _remove_odd(self, root: Directory, name: str) -> bool:
        """Remove the entry ``name`` if it is not a regular file; True if one was removed."""
        before = root.lstat(name)
        if before is None or stat.S_ISREG(before.st_mode):
            return False
        with self._locked():
            now = root.lstat(name)
            if now is None or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
                return False
            log.warning("plancache: replacing %s, which is %s", root.path / name, kind(now.st_mode))
            _remove(root, name)
        return True

    # -- helpers ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _directory(self, *, create: bool = False) -> Iterator[Directory]:
        """The store directory's guarded handle (made, with its parents, where absent and
        ``create``), closed after; its failures as the store's errors."""
        try:
            root = Directory.make(self.root) if create else Directory.open(self.root)
        except OSError as exc:
            raise _store_error(self.root, "open the directory", exc) from exc
        if root is None:
            raise PlanStoreNotFoundError(f"{self.root}: directory does not exist")
        with root:
            yield root

    def _sync(self, root: Directory) -> None:
        try:
            os.fsync(root.fd)
        except OSError as exc:
            raise _store_error(self.root, "sync directory", exc) from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Callable[[], bool]]:
        """Exclusive ``flock`` on the store's sidecar lock file (serialises replace/delete),
        waited for at most ``lock_timeout`` seconds (then ``PlanStoreUnavailableError``).
        The lock file is never followed if it is a symbolic link, and the lock counts only
        while the file locked is still the one at the lock's path: the context gives a check
        of that, to call right before committing."""
        lock = os.path.join(self._root, LOCK_NAME)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            fd = self._open_lock(lock)
            try:
                if self._flock(fd, deadline):
                    still_locked = functools.partial(_is_at, lock, os.fstat(fd))
                    if still_locked():
                        yield still_locked
                        return
                if time.monotonic() >= deadline:
                    raise PlanStoreUnavailableError(
                        f"{lock}: another process held the lock for over {self.lock_timeout:g} s"
                    )
            finally:
                os.close(fd)  # closing releases the lock

    def _open_lock(self, lock: str) -> int:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | NO_FOLLOW, LOCK_MODE)
        except FileNotFoundError:
            raise PlanStoreNotFoundError(f"{self.root}: directory does not exist") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PlanStoreError(
                    f"{lock}: the lock file is a symbolic link; remove it", cause=exc
                ) from exc
            raise _store_error(Path(lock), "open lock file", exc) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise PlanStoreError(f"{lock}: the lock file is not a regular file; remove it")
        return fd

    @staticmethod
    def _flock(fd: int, deadline: float) -> bool:
        """``flock(fd)`` exclusively, polling until ``deadline``; True once held."""
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def temp_files(self, name: str = "") -> list[Path]:
        """Temp files in the store directory (in-flight or abandoned writes of any kind, or
        of the object ``name`` only); entries with a temp name that are not regular files
        (never written by plancache) are left alone."""
        start = f".{name}." if name else "."
        try:
            names = [
                n for n in os.listdir(self.root) if n.startswith(start) and n.endswith(TEMP_SUFFIX)
            ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _store_error(self.root, "list", exc) from exc
        return [self.root / n for n in names if _odd(os.path.join(self._root, n)) is None]

    def remove_stale_temp_files(
        self, older_than: float = STALE_TEMP_SECONDS, *, dry_run: bool = False, name: str = ""
    ) -> int:
        """Delete temp files (of the object ``name`` only, if given) older than ``older_than``
        seconds (left by killed writers); returns how many were (or, with ``dry_run``, would
        be) removed. Younger ones may belong to a live writer."""
        cutoff = time.time() - older_than
        removed = 0
        paths = self.temp_files(name)
        if not paths:
            return 0
        with self._directory() as root:
            for path in paths:
                try:
                    st = root.lstat(path.name)
                    if st is not None and st.st_mtime <= cutoff:
                        if not dry_run:
                            root.remove(path.name, st)
                        removed += 1
                except OSError as exc:
                    raise _store_error(path, "remove", exc) from exc
        return removed
