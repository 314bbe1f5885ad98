"""What the object-store backends share: URL parsing, time bounds, running async client calls.

Every call a backend makes runs on fsspec's event loop under a hard bound
(``CallTimeouts.total``; ``UPLOAD_CALL_S`` for each part of a streamed write and for completing
it); past it the call is cancelled and ``PlanStoreUnavailableError`` raised. A listing is
bounded per page by the same, and in all by ``RemoteStore.list_timeout`` and
``max_list_pages``.
Backends translate their client's exceptions with ``translate``; messages name the store,
the action and a status or error code, never a credential: what they copy from an error
body is cut to a safe character set and length, and every message (the client's exceptions
too) has the storage options' secrets and the credentials the client resolved itself
(``RemoteStore.secrets``) masked, so an endpoint that echoes them gets nothing printed.

The blocking work that event loop hands to threads (``getaddrinfo``: a resolver may take
many seconds, or never answer) runs in daemon threads (``DaemonThreads``), so a lookup stuck
there never delays the exit of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import os
import time
import weakref
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, ParamSpec, Self, TypeVar
from urllib.parse import urlsplit

from fsspec.asyn import sync
from fsspec.exceptions import FSTimeoutError

from plancache import _background as background
from plancache import _metrics as metrics
from plancache._defaults import CALL_S, CONNECT_S, MAX_SECONDS, READ_S
from plancache._objects import ObjectLayer, check_name
from plancache._redaction import MIN_SECRET_LENGTH, redact, scrub_exception, secret_values
from plancache.errors import (
    ConfigError,
    PlancacheError,
    PlanStoreError,
    PlanStoreUnavailableError,
    UnsupportedStoreError,
)

T = TypeVar("T")
P = ParamSpec("P")

MAX_RETRIES = 10
"""Most retries a storage option may ask for."""
MAX_RESOLVED = 16
"""Resolved credentials a store masks at most (``RemoteStore.resolved``)."""

ERROR_BODY_LIMIT = 8 * 1024
"""Bytes of an error response read at most (its code and message fit in far less)."""
BODY_LIMIT = 1 << 20
"""Bytes of any other buffered response (a listing page, a write's answer) read at most."""
PROBE_PREFIX = ".plancache-probe"
"""Where under a store's prefix the conformance probe writes (``plancache._probe``)."""


class ResponseTooLargeError(PlancacheError):
    """An endpoint sent a response body over the limit for its kind; the rest is not read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"response body over {limit} bytes")


@dataclass(frozen=True)
class CallTimeouts:
    """Bounds on one network call to a store: ``connect`` and ``read`` per HTTP attempt,
    ``retries`` extra attempts after a transport or server error, ``total`` for the whole
    call. (The lookup/record budget of ``PlanCache`` bounds a boot's calls together.)"""

    connect: float = CONNECT_S
    read: float = READ_S
    retries: int = 1
    total: float = CALL_S

    #: storage option -> field; these options are plancache's, not the client library's
    OPTIONS: ClassVar[Mapping[str, str]] = {
        "connect_timeout": "connect",
        "read_timeout": "read",
        "retries": "retries",
        "timeout": "total",
    }

    @classmethod
    def split(cls, options: Mapping[str, Any]) -> tuple[CallTimeouts, dict[str, Any]]:
        """(the bounds named in ``options``, the other options); ``options`` is not changed.
        Raises ``ConfigError`` for a bound outside (0, ``MAX_SECONDS``] or retries outside
        0..``MAX_RETRIES``."""
        d = cls()
        given = {field: options[name] for name, field in cls.OPTIONS.items() if name in options}
        try:
            t = cls(
                connect=float(given.get("connect", d.connect)),
                read=float(given.get("read", d.read)),
                retries=int(given.get("retries", d.retries)),
                total=float(given.get("total", d.total)),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad time bound in storage options: {exc}") from None
        seconds = (t.connect, t.read, t.total)
        if not all(0 < s <= MAX_SECONDS for s in seconds) or not 0 <= t.retries <= MAX_RETRIES:
            raise ConfigError(
                f"timeouts must be in (0, {MAX_SECONDS:g}] seconds and retries in "
                f"0..{MAX_RETRIES}, got {t}"
            )
        rest = {k: v for k, v in options.items() if k not in cls.OPTIONS}
        return t, rest


def client_option_names(*inits: Callable[..., Any]) -> frozenset[str]:
    """The keyword options the client constructors ``inits`` take, plus fsspec's own
    (anything else would fail on the first call, far from where it was given)."""
    names = {"use_listings_cache", "listings_expiry_time", "max_paths"}
    for init in inits:
        names |= set(inspect.signature(init).parameters)
    return frozenset(names - {"self", "kwargs", "loop", "asynchronous", "skip_instance_cache"})


def split_url(url: str) -> tuple[str, str, str]:
    """``scheme://bucket/prefix`` -> (scheme, bucket, prefix without surrounding slashes).
    Any user information in the URL is dropped (it never belongs in a store URL)."""
    parts = urlsplit(url)
    bucket = parts.netloc.rpartition("@")[2]
    if not bucket:
        raise UnsupportedStoreError(f"{parts.scheme}:// URL names no bucket")
    return parts.scheme.lower(), bucket, parts.path.strip("/")


async def read_bounded(read: Callable[[int], Awaitable[bytes]], limit: int) -> bytes:
    """Bytes from ``read(n)`` (which may return fewer than ``n``) until EOF or ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class StreamReader:
    """A streamed response body, read chunk by chunk on the store's event loop, each read
    under the store's call bound; closing it drops the connection."""

    def __init__(
        self,
        store: RemoteStore,
        read: Callable[[int], Awaitable[bytes]],
        close: Callable[[], object],
    ) -> None:
        self._store, self._read, self._close = store, read, close

    def read(self, n: int, /) -> bytes:
        async def chunk() -> bytes:
            return await self._read(n)

        return self._store._run("read", chunk)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._close()


class DaemonThreads(ThreadPoolExecutor):
    """An event loop's default executor that runs each call in a daemon thread of its own.
    A ``ThreadPoolExecutor``'s threads are joined when the interpreter exits, so one stuck
    in ``getaddrinfo`` would hold the process up to the resolver's timeout; these are not
    waited for. (A ``ThreadPoolExecutor`` subclass only because asyncio requires one.)"""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the future's owner
                future.set_exception(exc)
            else:
                future.set_result(result)

        background.start(run, "plancache-blocking")
        return future


_DAEMON_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
"""Event loops whose default executor is a ``DaemonThreads``."""


def use_daemon_threads(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``DaemonThreads`` the default executor of ``loop`` (once; set on the loop's own
    thread, before any call scheduled after this one)."""
    if loop not in _DAEMON_LOOPS:
        _DAEMON_LOOPS.add(loop)
        loop.call_soon_threadsafe(loop.set_default_executor, DaemonThreads())


class RemoteStore(ObjectLayer):
    """A bucket and prefix on an object store whose client runs on fsspec's event loop."""

    #: Objects per listing request (the services' maximum is 1000).
    list_page_size: int = 1000
    #: Bounds on one listing: pages (10 million objects at 1000 a page) and seconds in all.
    max_list_pages: int = 10_000
    list_timeout: float = 600.0

    #: The fsspec filesystem whose session, credentials and event loop the store uses.
    fs: Any
    #: Storage options the client library takes (besides plancache's time bounds).
    accepted_options: ClassVar[frozenset[str]]

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        """Reads plancache's time bounds from ``options``; ``client_options`` holds the rest,
        for the client library."""
        self.scheme, self.bucket, self.prefix = split_url(url)
        self.timeouts, self.client_options = CallTimeouts.split(options)
        self._options = redact(options)
        self._secrets = tuple(secret_values({"url": url, **options}))
        self._resolved: tuple[str, ...] = ()
        self._pid = os.getpid()
        unknown = sorted(set(self.client_options) - self.accepted_options)
        if unknown:
            raise UnsupportedStoreError(
                f"{self.url}: unknown {self.scheme}:// storage option(s): {', '.join(unknown)}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, {self._options!r})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """What every message of this store masks: the storage options' secrets (with URL
        user information and its Basic-auth encodings) and the credentials the client
        resolved itself (``resolved``)."""
        return (*self._secrets, *self._resolved)

    def resolved(self, *credentials: str | None) -> None:
        """Mask ``credentials`` (what the client resolved and may send: an access key id,
        a secret, a session or access token) in every message from now on; the latest
        ``MAX_RESOLVED`` are kept (a refreshed token replaces an old one)."""
        new = [c for c in credentials if c and len(c) >= MIN_SECRET_LENGTH]
        if any(c not in self._resolved for c in new):
            kept = [c for c in self._resolved if c not in new]
            self._resolved = (*kept, *new)[-MAX_RESOLVED:]

    @property
    def url(self) -> str:
        path = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.bucket}{path}"

    def _key(self, name: str) -> str:
        """The key of the object ``name`` (a base name) under the prefix."""
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def call_timeout(self) -> float:
        return self.timeouts.total

    def probe_store(self) -> Self:
        """This store on the same client, under ``{prefix}/.plancache-probe``: where the
        conformance probe writes (plan listings, which stop at ``/``, never see it). Closing
        the original closes it."""
        other = copy.copy(self)
        other.prefix = f"{self.prefix}/{PROBE_PREFIX}" if self.prefix else PROBE_PREFIX
        return other

    @abstractmethod
    def credential_source(self) -> str:
        """Where the client's credentials come from: its name for its method (``anon``,
        ``env``, ...), never a secret (may open the client)."""

    @abstractmethod
    def endpoint(self) -> str:
        """The endpoint URL the client sends requests to (may open the client; sends no
        request)."""

    @property
    def _list_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the client library runs on."""
        loop: asyncio.AbstractEventLoop = self.fs.loop
        return loop

    @abstractmethod
    async def _list_page(self, token: str | None, prefix: str) -> tuple[list[str], str | None]:
        """One page of the keys that start with ``prefix`` (a whole key prefix), directly
        under the store's prefix, and the next page's token (None: the last page)."""

    def list_objects(self, prefix: str) -> Iterator[str]:
        """Every page, each under the call bound; a repeated page token, more than
        ``max_list_pages`` pages or more than ``list_timeout`` seconds in all raise
        ``PlanStoreUnavailableError`` (an endpoint that never ends its listing)."""
        token: str | None = None
        seen: set[str] = set()
        deadline = time.monotonic() + self.list_timeout
        where = self._list_prefix
        for _ in range(self.max_list_pages):
            keys, token = self._run(
                "list", functools.partial(self._list_page, token, where + prefix)
            )
            for key in keys:
                name = key[len(where) :]
                if key.startswith(where + prefix) and name and "/" not in name:
                    yield name
            if token is None:
                return
            if token in seen:
                raise PlanStoreUnavailableError(
                    f"{self.url}: list: the endpoint repeated a page token (a listing loop)"
                )
            seen.add(token)
            if time.monotonic() > deadline:
                raise PlanStoreUnavailableError(
                    f"{self.url}: list: not done within {self.list_timeout:g} s"
                )
        raise PlanStoreUnavailableError(
            f"{self.url}: list: not done within {self.max_list_pages} pages"
        )

    def unexpected(self, action: str, what: str) -> PlanStoreError:
        """The error for an answer of a shape the service never sends."""
        return PlanStoreError(f"{self.url}: {action}: unexpected answer from the endpoint: {what}")

    @abstractmethod
    def translate(self, exc: Exception, action: str) -> PlanStoreError | None:
        """The store error for a client exception, or None for an unexpected one."""

    def _run(
        self,
        action: str,
        coro: Callable[[], Coroutine[Any, Any, T]],
        timeout: float | None = None,
    ) -> T:
        """``coro()`` on the client's loop, bounded by ``timeout`` (default
        ``timeouts.total``); the client's known exceptions become ``PlanStoreError``
        subclasses, others propagate."""

        async def translated() -> T:
            try:
                return await coro()
            except ResponseTooLargeError as exc:
                raise PlanStoreUnavailableError(f"{self.url}: {action}: {exc}", cause=exc) from exc
            except Exception as exc:  # the client's own errors (the bound cancels instead)
                scrub_exception(exc, self.secrets)
                error = self.translate(exc, action)
                if error is None:
                    raise
                raise scrub_exception(error, self.secrets) from exc

        if self._pid != os.getpid():
            raise PlanStoreUnavailableError(
                f"{self.url}: {action}: the client was opened in another process (before a "
                "fork) and cannot be used in this one: open the store again here"
            )
        use_daemon_threads(self._loop)
        bound = self.timeouts.total if timeout is None else timeout
        start = time.perf_counter()
        try:
            result: T = sync(self._loop, translated, timeout=bound)
        except FSTimeoutError as exc:
            raise PlanStoreUnavailableError(
                f"{self.url}: {action}: no answer within {bound:g} s", cause=exc
            ) from exc
        finally:
            metrics.request(self.scheme, action, time.perf_counter() - start)
        return result
