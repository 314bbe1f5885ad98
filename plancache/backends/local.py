"""Atomic plan store on a local (or shared) filesystem.

Create: write a uniquely named temp file in the same directory, fsync it, ``os.link`` it to
the final name (atomic; fails if the name exists), fsync the directory. Replace: under an
``flock`` on a sidecar lock file, check the stored content digest, then ``os.replace``.
Temp files are removed on every path; ones left by killed writers are removed by
:meth:`LocalStore.remove_stale_temp_files`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from plancache.defaults import default_dir
from plancache.errors import PlanStoreError, PlanStoreNotFoundError, PlanStorePermissionError
from plancache.fingerprint import OBJECT_PREFIX, fingerprint_of_name, object_name
from plancache.store import READ_LIMIT, PlanStore, content_version

TEMP_SUFFIX = ".tmp"
LOCK_NAME = ".startup_plan.lock"
STALE_TEMP_SECONDS = 3600.0


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

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        path = default_dir() if root is None else Path(root)
        self.root = Path(os.path.abspath(os.path.expanduser(path)))
        self._root = str(self.root)

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, fp: str) -> Path:
        return self.root / object_name(fp)

    # -- primitives -----------------------------------------------------------------------
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        path = os.path.join(self._root, object_name(fp))
        try:
            with open(path, "rb") as f:
                data = f.read(READ_LIMIT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None
            raise _store_error(Path(path), "read", exc) from exc
        return data, content_version(data)

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
        tmp = self._write_temp(fp, data)
        try:
            os.link(tmp, self._path(fp))
        except FileExistsError:
            return False
        except OSError as exc:
            raise _store_error(self._path(fp), "create", exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        self._sync_dir()
        return True

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        with self._locked():
            current = self._read(fp)
            if current is None or current[1] != version:
                return False
            tmp = self._write_temp(fp, data)
            try:
                os.replace(tmp, self._path(fp))
            except OSError as exc:
                raise _store_error(self._path(fp), "replace", exc) from exc
            finally:
                tmp.unlink(missing_ok=True)
        self._sync_dir()
        return True

    def _delete(self, fp: str) -> bool:
        if not self._path(fp).exists():
            return False
        with self._locked():
            try:
                self._path(fp).unlink()
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
    def _locked(self) -> Iterator[None]:
        """Exclusive ``flock`` on the store's sidecar lock file (serialises replace/delete)."""
        lock = self.root / LOCK_NAME
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            raise PlanStoreNotFoundError(f"{self.root}: directory does not exist") from None
        except OSError as exc:
            raise _store_error(lock, "open lock file", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def temp_files(self) -> list[Path]:
        """Temp files in the store directory (in-flight or abandoned writes)."""
        try:
            return [
                self.root / n
                for n in os.listdir(self.root)
                if n.startswith("." + OBJECT_PREFIX) and n.endswith(TEMP_SUFFIX)
            ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _store_error(self.root, "list", exc) from exc

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
                if path.stat().st_mtime <= cutoff:
                    if not dry_run:
                        path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _store_error(path, "remove", exc) from exc
        return removed
