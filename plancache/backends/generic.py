"""Plans on any other fsspec filesystem (``memory://``, ``sftp://``, ``abfs://``, ...).

fsspec offers no portable create-if-absent or compare-and-swap, so writes here are serialised
by a lock held by every ``FsspecStore`` of this process, and each record is written with one
``pipe_file`` call (no partial record is ever visible where the filesystem writes whole
objects). The version token is the record's sha256.

- ``memory://``: the filesystem lives in this process, so the lock makes create and replace
  atomic: ``atomic = True``.
- any other protocol: writers on other processes or hosts are not serialised; a racing write
  can be lost, and where the filesystem writes in place (sftp, ftp) a reader can see a
  partial record, which fails validation (never applied). ``atomic = False``, and each store
  logs one warning saying so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from plancache.errors import (
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)
from plancache.fingerprint import fingerprint_of_name, object_name
from plancache.redaction import redact, scrub, scrub_exception, secret_values
from plancache.store import READ_LIMIT, PlanStore, content_version

log = logging.getLogger("plancache")
_WRITE_LOCK = threading.RLock()


class FsspecStore(PlanStore):
    """A directory on an fsspec filesystem; atomic only where the filesystem is in-process."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        self._options = redact(storage_options)
        self._secrets = tuple(secret_values({"url": url, **storage_options}))
        self.fs: fsspec.AbstractFileSystem
        self.fs, path = url_to_fs(url, skip_instance_cache=True, **storage_options)
        self.root = path.rstrip("/")
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol
        # for messages, without user information or token (http(s) paths are whole URLs)
        whole = self.root if "://" in self.root else f"{protocols[0]}://{self.root.lstrip('/')}"
        self._url = scrub(whole)
        self.atomic = "memory" in protocols
        if not self.atomic:
            log.warning(
                "plancache: %s has no atomic create or compare-and-swap: concurrent writers on "
                "other processes or hosts may overwrite each other, and a partial record is "
                "possible where the filesystem writes in place (it is never applied)",
                self._url,
            )

    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r}, {self._options!r})"

    def _path(self, fp: str) -> str:
        return f"{self.root}/{object_name(fp)}"

    def _error(self, exc: Exception, action: str) -> PlanStoreError:
        where = f"{self.url}: {action}"
        scrub_exception(exc, self._secrets)
        if isinstance(exc, PermissionError):
            return PlanStorePermissionError(f"{where}: access denied", cause=exc)
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            return PlanStoreNotFoundError(f"{where}: not found", cause=exc)
        if isinstance(exc, (TimeoutError, ConnectionError)):
            return PlanStoreUnavailableError(f"{where}: {type(exc).__name__}", cause=exc)
        return PlanStoreError(f"{where}: {type(exc).__name__}: {exc}", cause=exc)

    # -- primitives ----------------------------------------------------------------------
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        try:
            with self.fs.open(self._path(fp), "rb") as f:
                data: bytes = f.read(READ_LIMIT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, "read") from exc
        return data, content_version(data)

    def _write(self, fp: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self._path(fp), data)
        except OSError as exc:
            raise self._error(exc, "write") from exc

    def _create(self, fp: str, data: bytes) -> bool:
        with _WRITE_LOCK:
            if self._read(fp) is not None:
                return False
            self._write(fp, data)
            return True

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        with _WRITE_LOCK:
            current = self._read(fp)
            if current is None or current[1] != version:
                return False
            self._write(fp, data)
            return True

    def _delete_if(self, fp: str, version: object) -> bool:
        with _WRITE_LOCK:
            current = self._read(fp)
            return current is not None and current[1] == version and self._delete(fp)

    def _delete(self, fp: str) -> bool:
        with _WRITE_LOCK:
            try:
                self.fs.rm_file(self._path(fp))
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise self._error(exc, "delete") from exc
            return True

    def _list(self) -> Iterator[str]:
        try:
            paths = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            raise self._error(exc, "list") from exc
        names = (str(p).rstrip("/").rpartition("/")[2] for p in paths)
        return (fp for fp in map(fingerprint_of_name, names) if fp is not None)
