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
``own``, ``warm``, ``close``), so that no kind ever asks which backend it is on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from plancache.errors import InvalidArgumentError

STALE_TEMP_SECONDS = 3600.0
"""Age past which a temp file of a write is a killed writer's leftover."""
PART_BYTES = 8 << 20
"""Bytes buffered per part of a streamed write (S3's minimum part is 5 MiB; GCS wants
multiples of 256 KiB)."""


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
    ) -> int:
        """Delete the temp files (of the object ``name`` only, if given) that killed writers
        left more than ``older_than`` seconds ago; how many were (or, with ``dry_run``, would
        be) removed. None to remove by default (a local directory has them)."""
        return 0

    def own(self) -> ObjectLayer:
        """This layer, reading only what no other local user could have written: a local
        directory refuses another user's files (``LocalStore.own``); every other layer is
        itself (what may write it is its credentials' business)."""
        return self

    def warm(self) -> None:
        """Start opening, on daemon threads, what this layer opens on first use (a lazy
        opening, a write guard's probe); returns at once. Nothing by default."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def close(self) -> None:
        """Release resources held by the store (sessions, pools). Idempotent."""
