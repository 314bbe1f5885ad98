"""The byte-level object API every backend offers (pure: no I/O libraries).

One API for every kind of cached thing (plans, compile artifacts, ...), in the spirit of
obstore's ``PutMode``: a kind is an encoding and a policy on top of it, and knows nothing
about S3, GCS or files. Names are base names under the store's location (no ``/``).

- ``read_object(name, limit)``: at most ``limit`` bytes and the version token, or None.
- ``open_object(name)``: a bounded stream (each ``read`` bounded by the store's call bound)
  and the version token, or None.
- ``write_object(name, chunks, mode)``: the object from an iterator of chunks, memory
  bounded by one part (``PART_BYTES``) whatever its size; ``CREATE`` only if absent, or
  ``Update(version)`` only if the stored version is still ``version``. True if written,
  False if the precondition failed (a racing writer won). Nothing is visible before the
  last chunk: an iterator that raises, or a process killed mid-stream, leaves no object.
- ``delete_object(name, version=None)``: remove it (only if its version is still
  ``version``, when given); True if this call removed it.
- ``list_objects(prefix)``: the base names that start with ``prefix``, with the listing
  bounds (pages, time, a repeated page token).

Failures raise ``PlanStoreError`` subclasses (``plancache.errors``).

Every backend (a local directory, S3, GCS, any fsspec filesystem, a third party's) and every
wrapper of one (``plancache._forwarding.ForwardingLayer``: a lazy opening, a write guard, a
read-only view) is an ``ObjectLayer`` and nothing else; each kind, plans included
(``plancache._store.PlanStore``), is built on one by composition. Besides the five
primitives a layer answers a few generic questions with safe defaults (``atomic``,
``check_writable``, ``known_to_ignore_preconditions``, ``remove_stale_temp_files``,
``own``, ``warm``, ``close``), so that no kind ever asks which backend it is on, and declares
its capabilities, again with safe defaults: whether its conditional writes must be probed
before it is written and where (``probe_store``), the endpoint and credentials ``plancache
doctor`` checks (``endpoint``, ``credential_source``, ``call_timeout``), and the local
directory it is (``local_directory``). The write guard, ``plancache doctor``, the inventory
and the crash-loop breaker ask these, never a backend's type (``tests/test_layout.py``
fails on an ``isinstance`` of a backend class outside ``plancache/_backends/``), so a
backend registered with ``register_backend`` gets what a built-in one gets by declaring the
same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from plancache._defaults import STALE_TEMP_SECONDS
from plancache.errors import InvalidArgumentError, MovedError

PART_BYTES = 8 << 20
"""Bytes buffered per part of a streamed write (S3's minimum part is 5 MiB; GCS wants
multiples of 256 KiB)."""


PLANS_KIND_NAMES = frozenset(
    {"get", "find", "put", "put_merged", "rewrite", "retract", "delete", "iter_fingerprints"}
    | {"read_raw", "use_keyring"}
)
"""What 0.3.0's backends answered as the plans kind, and ``PlanStore`` answers now."""


class Reader(Protocol):
    """A stream of an object's bytes: ``read(n)`` returns the next at most ``n`` bytes
    (``b""`` at the end)."""

    def read(self, n: int, /) -> bytes: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Opened:
    """An object opened for reading: its stream and version token."""

    reader: Reader
    version: object
    foreign: str | None = None
    """Why users other than this one (or root) could have written the object (a local
    store's file or directory that is theirs, or that group or others may write); None
    where only they could, or where the store cannot say (an object store: its
    credentials decide)."""

    def read(self, n: int, /) -> bytes:
        return self.reader.read(n)

    def close(self) -> None:
        self.reader.close()


@dataclass(frozen=True)
class Create:
    """Write mode: only if no object has the name."""


@dataclass(frozen=True)
class Update:
    """Write mode: only if the stored object's version is still ``version``."""

    version: object


CREATE: Final = Create()
WriteMode = Create | Update


def check_name(name: str) -> str:
    """``name`` if it can name an object (a base name: no ``/``, no NUL, not ``.`` or
    ``..``, at most 255 characters); else ``InvalidArgumentError`` (a ``ValueError``)."""
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > 255:
        raise InvalidArgumentError(f"not an object name: {name!r:.80}")
    return name


def parts(chunks: Iterable[bytes], size: int = PART_BYTES) -> Iterator[bytes]:
    """``chunks`` regrouped into parts of ``size`` bytes, then one last part with what is
    left: shorter than ``size``, and ``b""`` where the bytes are a multiple of ``size`` (no
    bytes at all, or exactly one part: ``[part, b""]``), so a part is known to be the last
    only once the next one is. At most one part is held at a time."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    yield bytes(buffer)


class ObjectLayer(ABC):
    """The object API (see the module docstring); every backend and wrapper implements it."""

    #: False where the backend cannot make create/replace atomic (documented per backend).
    atomic: bool = True

    @property
    @abstractmethod
    def url(self) -> str:
        """The store's location, without secrets."""

    @abstractmethod
    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        """At most ``limit`` bytes of object ``name`` and its version token; None if absent."""

    @abstractmethod
    def open_object(self, name: str) -> Opened | None:
        """Object ``name`` as a bounded stream with its version token; None if absent."""

    @abstractmethod
    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        """Write object ``name`` from ``chunks`` if ``mode`` holds; False if it does not."""

    @abstractmethod
    def delete_object(self, name: str, version: object | None = None) -> bool:
        """Remove object ``name`` (only its version ``version``, when given); True if this
        call removed it."""

    @abstractmethod
    def list_objects(self, prefix: str) -> Iterator[str]:
        """The base names of the objects whose names start with ``prefix``."""

    def check_writable(self) -> None:
        """Raise what a write would raise where this layer refuses writes now
        (``PlanStoreReadOnlyError`` and its subclasses, ``PlanStoreUnavailableError``), so
        that a kind fails before reading what it would write; may wait for a write guard's
        verdict. Nothing by default."""

    def known_to_ignore_preconditions(self) -> bool:
        """True if this layer, or one beneath it, is already known to ignore write
        preconditions (a write guard's verdict); never probes. False by default."""
        return False

    def remove_stale_temp_files(
        self, older_than: float = STALE_TEMP_SECONDS, *, dry_run: bool = False, name: str = ""
    ) -> int | None:
        """Delete the temp files (of the object ``name`` only, if given) that killed writers
        left more than ``older_than`` seconds ago; how many were (or, with ``dry_run``, would
        be) removed. None (the default) where the layer leaves no temp files behind (a local
        directory does)."""
        return None

    def own(self) -> ObjectLayer:
        """This layer, reading only what no other local user could have written: a local
        directory refuses another user's files (``LocalStore.own``); every other layer is
        itself (what may write it is its credentials' business)."""
        return self

    def warm(self) -> None:
        """Start opening, on daemon threads, what this layer opens on first use (a lazy
        opening, a write guard's probe); returns at once. Nothing by default."""

    # -- capabilities: what the layer is and needs, declared (safe defaults) ------------------
    def probe_store(self) -> ObjectLayer | None:
        """Where the conformance probe (``plancache._probe``) writes, for a layer whose
        conditional writes must be checked before anything is written through it (an object
        store behind HTTP: services and proxies may ignore the preconditions): this store on
        the same client under a prefix that none of its listings shows. Such a layer is
        written only once the probe found it honest (``GuardedStore``, on the one open path),
        and ``plancache doctor`` runs every step of the probe on it. None (the default) where
        there is nothing to probe (a local directory is atomic by construction)."""
        return None

    def endpoint(self) -> str | None:
        """The ``http(s)://`` URL the layer's requests go to (may open the client; sends no
        request): part of what a conformance verdict is about, and what ``plancache doctor``
        shows and checks the clock against. None (the default) where there is none."""
        return None

    def credential_source(self) -> str | None:
        """Where the layer's credentials come from, its name for the method (``env``,
        ``anon``, ...), never a secret (may open the client); None (the default) where it
        does not say."""
        return None

    @property
    def call_timeout(self) -> float | None:
        """Seconds one call of this layer takes at most, where the layer bounds its calls
        (``plancache doctor`` bounds its own request to the endpoint by it); None (the
        default) where it does not say."""
        return None

    def local_directory(self) -> Path | None:
        """The local directory this layer keeps its objects in, where it is one: a node's
        crash marks live beside them (``Breaker.beside``), and a command may require it to
        exist. None (the default) for every other store."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    if not TYPE_CHECKING:  # typed code names no method of the plans kind on a layer

        def __getattr__(self, name: str) -> object:
            """A method of 0.3.0's plans kind (``LocalStore(path).get(fp)``: the backends
            were the plans kind then) raises ``MovedError`` naming the plans kind built on
            the layer; any other missing name is an ``AttributeError``."""
            if name in PLANS_KIND_NAMES:
                raise MovedError(
                    f"{type(self).__name__}.{name}: a backend is an object layer since "
                    f"plancache 0.4.0, and plans are a kind built on it: write "
                    f"PlanStore(layer).{name}(...) or open_store(url).{name}(...)"
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def close(self) -> None:
        """Release resources held by the store (sessions, pools). Idempotent."""
