"""Layers that wrap another (a lazy opening, a write guard, a read-only view):
``ForwardingLayer``, their base, and ``beneath``, the walk down a stack of them.

A forwarding layer is an ``ObjectLayer`` like any backend: a kind built on it cannot tell
the two apart.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path

from plancache._defaults import STALE_TEMP_SECONDS
from plancache._objects import CREATE, ObjectLayer, Opened, WriteMode


def beneath(layer: ObjectLayer) -> Iterator[ObjectLayer]:
    """``layer`` and the layers it forwards to, outermost first (a ``LazyStore`` is opened
    on the way, within its bound)."""
    while True:
        yield layer
        if not isinstance(layer, ForwardingLayer):
            return
        layer = layer.inner


class ForwardingLayer(ObjectLayer):
    """A layer that adds behaviour in front of another (``inner``). Every method, the
    generic hooks and the capabilities included, goes to ``inner`` unless a subclass
    overrides it."""

    @property
    @abstractmethod
    def inner(self) -> ObjectLayer:
        """The layer the methods go to."""

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def atomic(self) -> bool:  # type: ignore[override]
        return self.inner.atomic

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        return self.inner.read_object(name, limit)

    def open_object(self, name: str) -> Opened | None:
        return self.inner.open_object(name)

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        return self.inner.write_object(name, chunks, mode)

    def delete_object(self, name: str, version: object | None = None) -> bool:
        return self.inner.delete_object(name, version)

    def list_objects(self, prefix: str) -> Iterator[str]:
        return self.inner.list_objects(prefix)

    def check_writable(self) -> None:
        self.inner.check_writable()

    def known_to_ignore_preconditions(self) -> bool:
        return self.inner.known_to_ignore_preconditions()

    def remove_stale_temp_files(
        self, older_than: float = STALE_TEMP_SECONDS, *, dry_run: bool = False, name: str = ""
    ) -> int | None:
        return self.inner.remove_stale_temp_files(older_than, dry_run=dry_run, name=name)

    def own(self) -> ObjectLayer:
        return self.inner.own()

    def warm(self) -> None:
        self.inner.warm()

    def probe_store(self) -> ObjectLayer | None:
        return self.inner.probe_store()

    def endpoint(self) -> str | None:
        return self.inner.endpoint()

    def credential_source(self) -> str | None:
        return self.inner.credential_source()

    @property
    def call_timeout(self) -> float | None:
        return self.inner.call_timeout

    def local_directory(self) -> Path | None:
        return self.inner.local_directory()

    def close(self) -> None:
        self.inner.close()
