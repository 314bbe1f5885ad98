"""A store opened on first use, with a bound on how long a use waits for the opening.

Opening a remote client can take long (importing its library, credential discovery: 15.7 s
measured for ``gs://`` without credentials). ``LazyStore`` opens on a daemon thread
(``plancache._background``) on first use, or earlier with ``start``; each use waits at most
``open_timeout`` seconds for it, then raises ``PlanStoreUnavailableError`` naming the bound
while the opening goes on for the next use. A failed opening raises its error, and the next
use tries again. Once open, every method goes to the opened store (``ForwardingStore``), its
own overrides included. A local tier in front of a ``LazyStore`` therefore answers without
waiting for the remote at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from plancache import _background as background
from plancache._background import Job, JobTimeout
from plancache._forwarding import ForwardingStore
from plancache._redaction import without_userinfo
from plancache._signing import Keyring
from plancache._store import PlanStore
from plancache.errors import PlanStoreUnavailableError

OPEN_TIMEOUT_S = 5.0
"""Seconds a use of a ``LazyStore`` waits at most for its store to open."""


class LazyStore(ForwardingStore):
    """The store ``opener()`` returns, opened on first use; ``url`` names it until then."""

    def __init__(
        self, url: str, opener: Callable[[], PlanStore], *, open_timeout: float = OPEN_TIMEOUT_S
    ) -> None:
        self._url = without_userinfo(url)
        self._opener = opener
        self.open_timeout = open_timeout
        self._lock = threading.Lock()
        self._opening: Job[PlanStore] | None = None
        self._store: PlanStore | None = None
        self._keyring: Keyring | None = None
        self._warm_beneath = False

    @property
    def inner(self) -> PlanStore:
        """The opened store (``opened``)."""
        return self.opened

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
        opens; without a call, the opened store keeps the keyring it opened with)."""
        with self._lock:
            self.keyring = self._keyring = keyring
            if self._store is not None:
                self._store.use_keyring(keyring)

    def _open(self) -> PlanStore:
        store = self._opener()
        with self._lock:
            if self._keyring is not None:
                store.use_keyring(self._keyring)
            self._store = store
            warm = self._warm_beneath
        if warm and isinstance(store, ForwardingStore):
            store.warm()
        return store

    def start(self) -> Job[PlanStore]:
        """Start opening the store on a daemon thread, unless it is open or opening (a
        failed opening starts again); returns at once."""
        with self._lock:
            job = self._opening
            if job is None or (job.done() and self._store is None):
                job = self._opening = background.start(self._open, "plancache-open")
            return job

    def warm(self) -> None:
        """Start opening this store (``start``) and then, on the same thread, the stores
        beneath it that open on first use; returns at once."""
        with self._lock:
            self._warm_beneath = True
            store = self._store
        if store is None:
            self.start()
        elif isinstance(store, ForwardingStore):
            store.warm()

    @property
    def opened(self) -> PlanStore:
        """The store, opened now or earlier; ``PlanStoreUnavailableError`` if it is not open
        within ``open_timeout`` seconds, or the error that opening it raised."""
        if self._store is not None:
            return self._store
        try:
            return self.start().wait(self.open_timeout)
        except JobTimeout:
            raise PlanStoreUnavailableError(
                f"{self._url}: open: the client did not open within {self.open_timeout:g} s"
            ) from None

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
