"""A store opened on first use, with a bound on how long a use waits for the opening.

Opening a remote client can take long (importing its library, credential discovery: 15.7 s
measured for ``gs://`` without credentials). ``LazyStore`` opens in a daemon thread on first
use; each use waits at most ``open_timeout`` seconds for it, then raises
``PlanStoreUnavailableError`` naming the bound while the opening goes on for the next use.
A failed opening raises its error, and the next use tries again. A local tier in front of a
``LazyStore`` therefore answers without waiting for the remote at all.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from plancache.backends import open_store
from plancache.errors import PlanStoreUnavailableError
from plancache.plan import Plan
from plancache.redaction import without_userinfo
from plancache.signing import Keyring
from plancache.store import PlanStore, PutOutcome

OPEN_TIMEOUT_S = 5.0
"""Seconds a use of a ``LazyStore`` waits at most for its store to open."""


def open_lazily(url: str, **storage_options: Any) -> LazyStore:
    """``open_store(url, **storage_options)``, opened on first use (see ``LazyStore``)."""
    return LazyStore(url, functools.partial(open_store, url, **storage_options))


class LazyStore(PlanStore):
    """The store ``opener()`` returns, opened on first use; ``url`` names it until then."""

    def __init__(
        self, url: str, opener: Callable[[], PlanStore], *, open_timeout: float = OPEN_TIMEOUT_S
    ) -> None:
        self._url = without_userinfo(url)
        self._opener = opener
        self.open_timeout = open_timeout
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: PlanStore | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return self._store.url if self._store is not None else self._url

    def __repr__(self) -> str:
        return repr(self._store) if self._store is not None else f"LazyStore({self._url!r})"

    @property
    def atomic(self) -> bool:  # type: ignore[override]
        """The opened store's; True until it is open."""
        return self._store.atomic if self._store is not None else True

    def use_keyring(self, keyring: Keyring) -> None:
        """Sign and judge records with ``keyring``, in the opened store too (now or once it
        opens)."""
        super().use_keyring(keyring)
        if self._store is not None:
            self._store.use_keyring(keyring)

    def _open(self) -> None:
        try:
            store = self._opener()
            store.use_keyring(self.keyring)
            self._store = store
        except BaseException as exc:  # handed to the waiting caller
            self._error = exc
        finally:
            self._done.set()

    @property
    def opened(self) -> PlanStore:
        """The store, opened now or earlier; ``PlanStoreUnavailableError`` if it is not open
        within ``open_timeout`` seconds, or the error that opening it raised."""
        if self._store is not None:
            return self._store
        with self._lock:
            if self._thread is None or (self._done.is_set() and self._store is None):
                self._done.clear()
                self._error = None
                self._thread = threading.Thread(
                    target=self._open, name="plancache-open", daemon=True
                )
                self._thread.start()
            done = self._done
        if not done.wait(self.open_timeout):
            raise PlanStoreUnavailableError(
                f"{self._url}: open: the client did not open within {self.open_timeout:g} s"
            )
        if self._store is None:
            assert self._error is not None
            raise self._error
        return self._store

    # The five primitives and get, find, put, delete, iter_fingerprints and read_raw go to
    # the opened store; put_merged, rewrite and retract run here (PlanStore's merge loop on
    # the opened store's primitives).
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        return self.opened._read(fp)

    def _create(self, fp: str, data: bytes) -> bool:
        return self.opened._create(fp, data)

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        return self.opened._replace(fp, data, version)

    def _delete_if(self, fp: str, version: object) -> bool:
        return self.opened._delete_if(fp, version)

    def _delete(self, fp: str) -> bool:
        return self.opened._delete(fp)

    def _list(self) -> Iterator[str]:
        return self.opened._list()

    def get(self, fp: str) -> Plan | None:
        return self.opened.get(fp)

    def find(self, fp: str, usable: Callable[[Plan], bool]) -> Plan | None:
        return self.opened.find(fp, usable)

    def put(self, plan: Plan) -> PutOutcome:
        return self.opened.put(plan)

    def delete_if(self, fp: str, doomed: Callable[[bytes], bool]) -> bool:
        return self.opened.delete_if(fp, doomed)

    def delete(self, fp: str) -> bool:
        return self.opened.delete(fp)

    def iter_fingerprints(self) -> Iterator[str]:
        return self.opened.iter_fingerprints()

    def read_raw(self, fp: str) -> bytes | None:
        return self.opened.read_raw(fp)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
