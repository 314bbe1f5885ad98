"""Plans on any other fsspec filesystem (``memory://``, ``sftp://``, ``abfs://``, ...).

fsspec offers no portable create-if-absent or compare-and-swap. A write streams the object
to a hidden temp object beside it (``.<name>.<random>.tmp``, never listed), then, under a
lock held by every ``FsspecStore`` of this process, checks its mode (absent, or the version
read) and moves the temp object into place with ``fs.mv`` (a rename where the filesystem has
one, else a copy and a delete); the temp object is removed on every path of a live writer (a
killed one leaves it). The version token is the sha256 of the bytes read.

- ``memory://``: the filesystem lives in this process, so the lock makes create and replace
  atomic: ``atomic = True``.
- any other protocol: writers on other processes or hosts are not serialised; a racing write
  can be lost (the check and the move are two calls), and where the move is a copy a reader
  can see a partial object, which fails validation (never applied). ``atomic = False``, and
  each store logs one warning saying so.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from plancache._objects import CREATE, ObjectLayer, Opened, Update, WriteMode, check_name
from plancache._redaction import redact, scrub, scrub_exception, secret_values
from plancache._store import content_version
from plancache.errors import (
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)

log = logging.getLogger("plancache")
_WRITE_LOCK = threading.RLock()


@dataclass(frozen=True)
class _Read:
    """The version token of a read of at most ``limit`` bytes: their sha256."""

    digest: str
    limit: int


class FsspecStore(ObjectLayer):
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

    def _path(self, name: str) -> str:
        return f"{self.root}/{check_name(name)}"

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

    # -- the object layer -----------------------------------------------------------------
    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        try:
            with self.fs.open(self._path(name), "rb") as f:
                data: bytes = f.read(limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, "read") from exc
        return data, _Read(content_version(data), limit)

    def open_object(self, name: str) -> Opened | None:
        """The version token is the stored bytes' sha256, read here once to the end (a
        stream that follows reads the file again)."""
        found = self._digest(name)
        if found is None:
            return None
        try:
            f = self.fs.open(self._path(name), "rb")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, "read") from exc
        return Opened(f, found)

    def _digest(self, name: str) -> str | None:
        """The sha256 of object ``name``'s bytes, read in chunks; None if it is absent."""
        digest = hashlib.sha256()
        try:
            with self.fs.open(self._path(name), "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, "read") from exc
        return digest.hexdigest()

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        """Streams to a temp object, then, under the process's lock, checks ``mode`` and
        moves it into place."""
        final = self._path(name)
        temp = f"{self.root}/.{name}.{secrets.token_hex(8)}.tmp"
        try:
            with self.fs.open(temp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            with _WRITE_LOCK:
                if isinstance(mode, Update):
                    if not self._matches(name, mode.version):
                        return False
                elif self.fs.exists(final):
                    return False
                self.fs.mv(temp, final)
                return True
        except OSError as exc:
            raise self._error(exc, "write") from exc
        finally:
            with contextlib.suppress(OSError):
                if self.fs.exists(temp):
                    self.fs.rm_file(temp)

    def delete_object(self, name: str, version: object | None = None) -> bool:
        with _WRITE_LOCK:
            if version is not None and not self._matches(name, version):
                return False
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise self._error(exc, "delete") from exc
            return True

    def _matches(self, name: str, version: object) -> bool:
        """True if object ``name`` is still the version ``version`` names."""
        if isinstance(version, _Read):
            found = self.read_object(name, version.limit)
            return found is not None and found[1] == version
        return self._digest(name) == version

    def list_objects(self, prefix: str) -> Iterator[str]:
        try:
            paths = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            raise self._error(exc, "list") from exc
        names = (str(p).rstrip("/").rpartition("/")[2] for p in paths)
        return iter(sorted(n for n in names if n.startswith(prefix) and not n.startswith(".")))
