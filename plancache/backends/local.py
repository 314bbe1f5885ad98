"""Atomic plan store on a local (or shared) filesystem.

Create: write a uniquely named temp file in the same directory, fsync it, ``os.link`` it to
the final name (atomic; fails if the name exists), fsync the directory. Replace: under an
``flock`` on a sidecar lock file, check that the stored bytes are still those read (the
bytes are the version token), then ``os.replace``; a conditional delete checks them under the
same lock, then unlinks.
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
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from plancache.defaults import default_dir
from plancache.errors import (
    InvalidPlanError,
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)
from plancache.fingerprint import OBJECT_PREFIX, fingerprint_of_name, object_name
from plancache.store import READ_LIMIT, PlanStore

TEMP_SUFFIX = ".tmp"
LOCK_NAME = ".startup_plan.lock"
STALE_TEMP_SECONDS = 3600.0
LOCK_MODE = 0o664
_NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
log = logging.getLogger("plancache")


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in (
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


def _remove(path: str) -> None:
    """Remove the entry at ``path`` whatever it is (a directory with what it holds; links
    are removed, never followed)."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _read_at_most(fd: int, size: int) -> bytes:
    """At most ``READ_LIMIT`` bytes of ``fd``: in one read where the file still has the
    ``size`` its ``fstat`` gave (a file that grew meanwhile reads as is), else to its end."""
    data = os.read(fd, size if 0 < size < READ_LIMIT else READ_LIMIT)
    if len(data) == size or not data:
        return data
    chunks, got = [data], len(data)
    while got < READ_LIMIT:
        chunk = os.read(fd, READ_LIMIT - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _store_error(path: Path, action: str, exc: OSError) -> PlanStoreError:
    message = f"{path}: cannot {action}: {exc.strerror or exc}"
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PlanStorePermissionError(message, cause=exc)
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return PlanStoreNotFoundError(message, cause=exc)
    return PlanStoreError(message, cause=exc)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(PlanStore):
    """Plans as ``startup_plan_{fp}.json`` files in one directory (created on first write)."""

    #: Seconds a replace or delete waits at most for another process's lock.
    lock_timeout: float = 5.0

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        path = default_dir() if root is None else Path(root)
        self.root = Path(os.path.abspath(os.path.expanduser(path)))
        self._root = str(self.root)
        self._dir = self._root.rstrip("/") + "/"  # where plan files are named (root "/" too)

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, fp: str) -> Path:
        return self.root / object_name(fp)

    # -- primitives -----------------------------------------------------------------------
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        """Raises ``InvalidPlanError`` for an entry that is not a regular file."""
        path = self._dir + object_name(fp)
        try:
            fd = os.open(path, os.O_RDONLY | _NO_FOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None
            odd = _odd(path) if exc.errno in (errno.ELOOP, errno.ENXIO) else None
            if odd is not None:
                raise InvalidPlanError(f"{path} is {_kind(odd.st_mode)}, not a plan file") from None
            raise _store_error(Path(path), "read", exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidPlanError(f"{path} is {_kind(st.st_mode)}, not a plan file")
            data = _read_at_most(fd, st.st_size)
        except OSError as exc:
            raise _store_error(Path(path), "read", exc) from exc
        finally:
            os.close(fd)
        return data, data  # the bytes are their own version token: no hash on every read

    def _write_temp(self, fp: str, data: bytes) -> Path:
        """A fsynced temp file in the store directory holding ``data``; caller removes it."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _store_error(self.root, "create directory", exc) from exc
        prefix = f".{object_name(fp)}.{os.uname().nodename}.{os.getpid()}.{secrets.token_hex(4)}."
        try:
            fd, name = tempfile.mkstemp(dir=self.root, prefix=prefix, suffix=TEMP_SUFFIX)
        except OSError as exc:
            raise _store_error(self.root, "create a temp file", exc) from exc
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _store_error(tmp, "write", exc) from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _create(self, fp: str, data: bytes) -> bool:
        """Also replaces an entry that is not a regular file (a dangling link, a FIFO, ...)."""
        tmp = self._write_temp(fp, data)
        path = str(self._path(fp))
        try:
            for _ in range(2):
                try:
                    os.link(tmp, path)
                    break
                except FileExistsError:
                    if not self._remove_odd(path):
                        return False
            else:
                return False
        except OSError as exc:
            raise _store_error(self._path(fp), "create", exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        self._sync_dir()
        return True

    def _remove_odd(self, path: str) -> bool:
        """Remove the entry at ``path`` if it is not a regular file; True if one was removed."""
        before = _odd(path)
        if before is None:
            return False
        with self._locked():
            now = _odd(path)
            if now is None or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
                return False
            log.warning("plancache: replacing %s, which is %s", path, _kind(now.st_mode))
            with contextlib.suppress(FileNotFoundError):
                _remove(path)
        return True

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        with self._locked() as still_locked:
            current = self._read(fp)
            if current is None or current[1] != version:
                return False
            tmp = self._write_temp(fp, data)
            try:
                if not still_locked():  # the lock file was replaced: another may hold it
                    return False
                os.replace(tmp, self._path(fp))
            except OSError as exc:
                raise _store_error(self._path(fp), "replace", exc) from exc
            finally:
                tmp.unlink(missing_ok=True)
        self._sync_dir()
        return True

    def _delete_if(self, fp: str, version: object) -> bool:
        with self._locked() as still_locked:
            current = self._read(fp)
            if current is None or current[1] != version or not still_locked():
                return False
            try:
                os.unlink(self._path(fp))
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise _store_error(self._path(fp), "delete", exc) from exc
        self._sync_dir()
        return True

    def _delete(self, fp: str) -> bool:
        """Removes whatever entry has the plan's name (links are not followed)."""
        path = str(self._path(fp))
        if not os.path.lexists(path):
            return False
        with self._locked():
            try:
                _remove(path)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise _store_error(self._path(fp), "delete", exc) from exc
        self._sync_dir()
        return True

    def _list(self) -> Iterator[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            raise _store_error(self.root, "list", exc) from exc
        return (fp for fp in map(fingerprint_of_name, names) if fp is not None)

    # -- helpers ---------------------------------------------------------------------------
    def _sync_dir(self) -> None:
        try:
            _fsync_dir(self.root)
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
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | _NO_FOLLOW, LOCK_MODE)
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

    def temp_files(self) -> list[Path]:
        """Temp files in the store directory (in-flight or abandoned writes); entries with a
        temp name that are not regular files (never written by plancache) are left alone."""
        try:
            names = [
                n
                for n in os.listdir(self.root)
                if n.startswith("." + OBJECT_PREFIX) and n.endswith(TEMP_SUFFIX)
            ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _store_error(self.root, "list", exc) from exc
        return [self.root / n for n in names if _odd(os.path.join(self._root, n)) is None]

    def remove_stale_temp_files(
        self, older_than: float = STALE_TEMP_SECONDS, *, dry_run: bool = False
    ) -> int:
        """Delete temp files older than ``older_than`` seconds (left by killed writers);
        returns how many were (or, with ``dry_run``, would be) removed. Younger ones may
        belong to a live writer."""
        cutoff = time.time() - older_than
        removed = 0
        for path in self.temp_files():
            try:
                if path.lstat().st_mtime <= cutoff:
                    if not dry_run:
                        path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _store_error(path, "remove", exc) from exc
        return removed
