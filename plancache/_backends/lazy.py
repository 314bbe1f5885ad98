"""What opens on first use, with a bound on how long a use waits for the opening.

Opening a remote client can take long (importing its library, credential discovery: 15.7 s
measured for ``gs://`` without credentials). ``Opening`` runs an opener on a daemon thread
(``plancache._background``) on first use, or earlier with ``start``; each use waits at most
``open_timeout`` seconds for it, then raises ``PlanStoreUnavailableError`` naming the bound
while the opening goes on for the next use. A failed opening raises its error, and the next
use tries again. ``LazyStore`` is the object layer an ``Opening`` yields (every method goes
to the opened layer, its own overrides included); ``PlanCache`` opens its store through an
``Opening`` too. A local tier in front of a ``LazyStore`` therefore answers without waiting
for the remote at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from plancache import _background as background
from plancache._background import Job, JobTimeout
from plancache._defaults import OPEN_TIMEOUT_S
from plancache._forwarding import ForwardingLayer
from plancache._objects import ObjectLayer
from plancache._redaction import without_userinfo
from plancache.errors import PlanStoreUnavailableError


class Warmable(Protocol):
    def warm(self) -> None: ...


T = TypeVar("T", bound=Warmable)


class Opening(Generic[T]):
    """What ``opener()`` returns, opened on first use (see the module); ``name`` names it in
    messages until then."""

    def __init__(
        self, name: str, opener: Callable[[], T], *, open_timeout: float = OPEN_TIMEOUT_S
    ) -> None:
        self.name = name
        self._opener = opener
        self.open_timeout = open_timeout
        self._lock = threading.Lock()
        self._opening: Job[T] | None = None
        self.value: T | None = None
        """What was opened; None until then."""
        self._warm_beneath = False

    def _open(self) -> T:
        value = self._opener()
        with self._lock:
            self.value = value
            warm = self._warm_beneath
        if warm:
            value.warm()
        return value

    def start(self) -> Job[T]:
        """Start opening on a daemon thread, unless it is open or opening (a failed opening
        starts again); returns at once."""
        with self._lock:
            job = self._opening
            if job is None or (job.done() and self.value is None):
                job = self._opening = background.start(self._open, "plancache-open")
            return job

    def warm(self) -> None:
        """Start opening (``start``) and then, on the same thread, warm what was opened (its
        ``warm``); returns at once."""
        with self._lock:
            self._warm_beneath = True
            value = self.value
        if value is None:
            self.start()
        else:
            value.warm()

    @property
    def opened(self) -> T:
        """What was opened, now or earlier; ``PlanStoreUnavailableError`` if it is not open
        within ``open_timeout`` seconds, or the error that opening it raised."""
        if self.value is not None:
            return self.value
        try:
            return self.start().wait(self.open_timeout)
        except JobTimeout:
            raise PlanStoreUnavailableError(
                f"{self.name}: open: the client did not open within {self.open_timeout:g} s"
            ) from None


class LazyStore(ForwardingLayer):
    """The layer ``opener()`` returns, opened on first use (``Opening``); ``url`` names it
    until then."""

    def __init__(
        self, url: str, opener: Callable[[], ObjectLayer], *, open_timeout: float = OPEN_TIMEOUT_S
    ) -> None:
        self._url = without_userinfo(url)
        self.opening: Opening[ObjectLayer] = Opening(self._url, opener, open_timeout=open_timeout)

    @property
    def inner(self) -> ObjectLayer:
        """The opened layer (``opened``)."""
        return self.opening.opened

    @property
    def opened(self) -> ObjectLayer:
        """The layer, opened now or earlier (``Opening.opened``)."""
        return self.opening.opened

    def start(self) -> Job[ObjectLayer]:
        """Start opening the layer (``Opening.start``); returns at once."""
        return self.opening.start()

    @property
    def url(self) -> str:
        store = self.opening.value
        return store.url if store is not None else self._url

    def __repr__(self) -> str:
        store = self.opening.value
        return repr(store) if store is not None else f"LazyStore({self._url!r})"

    @property
    def atomic(self) -> bool:  # type: ignore[override]
        """The opened layer's; True until it is open."""
        store = self.opening.value
        return store.atomic if store is not None else True

    def warm(self) -> None:
        """Start opening this layer and then, on the same thread, warm it (``Opening.warm``);
        returns at once."""
        self.opening.warm()

    def close(self) -> None:
        store = self.opening.value
        if store is not None:
            store.close()
