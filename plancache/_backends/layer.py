"""A third party's object layer, checked: ``CheckedLayer``.

A backend registered with ``plancache.register_backend`` (or the ``plancache.backends``
entry-point group) implements ``ObjectLayer`` only, as every built-in backend does.
``open_layer`` wraps what its factory returns in a ``CheckedLayer``, on which every kind
(plans, compile artifacts, model info, cache bundles) is built as on a built-in backend.

Guarantees the wrapper adds to whatever the layer does:

- every object name is checked (``check_name``) before the layer sees it;
- what the layer answers is checked for its type (a read is ``None`` or ``(bytes, version)``
  cut to ``limit`` bytes; a write or delete a ``bool``; a stream an ``Opened``; a listing
  only names starting with the prefix): a wrong answer raises ``PlanStoreError`` naming the
  layer, never a confusing failure in a kind;
- ``OSError`` from the layer becomes a ``PlanStoreError`` subclass (``PermissionError``:
  ``PlanStorePermissionError``; ``TimeoutError``, ``ConnectionError``:
  ``PlanStoreUnavailableError``) keeping it as ``cause``, with the storage options' secrets
  masked in the message; plancache's own errors and every other exception pass unchanged
  (a bug in a layer stays visible);
- ``close`` is called on the layer at most once.

What it cannot add: atomicity (the layer's ``write_object`` must honour ``CREATE`` and
``Update``; ``atomic`` is the layer's own attribute where it has one, else True) and time
bounds on each call (the layer bounds its own; ``PlanCache``'s budget bounds a lookup). The
generic hooks (``known_to_ignore_preconditions``, ``remove_stale_temp_files``, ``own``,
``warm``) and the capabilities (``probe_store``, ``endpoint``, ``credential_source``,
``call_timeout``, ``local_directory``) are the layer's own where it defines them, else
``ObjectLayer``'s defaults; their answers are checked for their type as well, and a probe
store it declares is checked in turn. So a layer that declares ``probe_store`` is written
only once the conformance probe found it honest, and ``plancache doctor`` probes it, as it
does the built-in object stores.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NoReturn

from plancache._defaults import STALE_TEMP_SECONDS
from plancache._objects import (
    CREATE,
    ObjectLayer,
    Opened,
    WriteMode,
    check_name,
)
from plancache._redaction import scrub, scrub_exception
from plancache.errors import (
    PlancacheError,
    PlanStoreError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)


class CheckedLayer(ObjectLayer):
    """``layer``, a third party's ``ObjectLayer``, checked (see the module); ``origin``
    names the backend in messages (``"memtest:// (mypkg.store:MemLayer)"``); ``secrets`` are
    masked in every message this store raises."""

    def __init__(self, layer: ObjectLayer, origin: str, secrets: Iterable[str] = ()) -> None:
        if not isinstance(layer, ObjectLayer):
            raise TypeError(f"not an ObjectLayer: {type(layer).__qualname__}")
        self.layer = layer
        self.origin = origin
        self.secrets = tuple(secrets)
        atomic = getattr(layer, "atomic", True)
        self.atomic = atomic if isinstance(atomic, bool) else True
        self._close_lock = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        url = self.layer.url
        if not isinstance(url, str) or not url:
            self._wrong("url", url, "a non-empty str")
        return scrub(url, self.secrets)

    def __repr__(self) -> str:
        return f"CheckedLayer({self.url!r}, {type(self.layer).__qualname__})"

    # -- the object layer, checked ------------------------------------------------------------
    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        check_name(name)
        with self._translated("read", name):
            found = self.layer.read_object(name, limit)
        if found is None:
            return None
        if not (
            isinstance(found, tuple)
            and len(found) == 2
            and isinstance(found[0], (bytes, bytearray, memoryview))
        ):
            self._wrong("read_object", found, "None or (bytes, version)")
        return bytes(found[0][:limit]), found[1]

    def open_object(self, name: str) -> Opened | None:
        check_name(name)
        with self._translated("open", name):
            opened = self.layer.open_object(name)
        if opened is not None and not isinstance(opened, Opened):
            self._wrong("open_object", opened, "None or an Opened")
        return opened

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        check_name(name)
        with self._translated("write", name):
            written = self.layer.write_object(name, chunks, mode)
        if not isinstance(written, bool):
            self._wrong("write_object", written, "a bool")
        return written

    def delete_object(self, name: str, version: object | None = None) -> bool:
        check_name(name)
        with self._translated("delete", name):
            deleted = self.layer.delete_object(name, version)
        if not isinstance(deleted, bool):
            self._wrong("delete_object", deleted, "a bool")
        return deleted

    def list_objects(self, prefix: str) -> Iterator[str]:
        with self._translated("list", prefix):
            names = iter(self.layer.list_objects(prefix))
        end = object()
        while True:
            with self._translated("list", prefix):
                name = next(names, end)
            if name is end:
                return
            if not isinstance(name, str):
                self._wrong("list_objects", name, "names (str)")
            if name.startswith(prefix):
                yield name

    # -- the generic hooks: the layer's own, where it has them ---------------------------------
    def check_writable(self) -> None:
        with self._translated("check", ""):
            self.layer.check_writable()

    def known_to_ignore_preconditions(self) -> bool:
        with self._translated("check", ""):
            return self.layer.known_to_ignore_preconditions() is True

    def remove_stale_temp_files(
        self, older_than: float = STALE_TEMP_SECONDS, *, dry_run: bool = False, name: str = ""
    ) -> int | None:
        with self._translated("clean", name):
            removed = self.layer.remove_stale_temp_files(older_than, dry_run=dry_run, name=name)
        if removed is not None and (not isinstance(removed, int) or isinstance(removed, bool)):
            self._wrong("remove_stale_temp_files", removed, "an int or None")
        return removed

    def own(self) -> ObjectLayer:
        with self._translated("own", ""):
            mine = self.layer.own()
        return self if mine is self.layer else CheckedLayer(mine, self.origin, self.secrets)

    def warm(self) -> None:
        with self._translated("warm", ""):
            self.layer.warm()

    # -- the capabilities: the layer's own, where it declares them -----------------------------
    def probe_store(self) -> ObjectLayer | None:
        with self._translated("probe", ""):
            target = self.layer.probe_store()
        if target is None:
            return None
        if not isinstance(target, ObjectLayer) or target is self.layer:
            self._wrong("probe_store", target, "None or another ObjectLayer")
        return CheckedLayer(target, self.origin, self.secrets)

    def endpoint(self) -> str | None:
        with self._translated("endpoint", ""):
            return self._text("endpoint", self.layer.endpoint())

    def credential_source(self) -> str | None:
        with self._translated("credentials", ""):
            return self._text("credential_source", self.layer.credential_source())

    @property
    def call_timeout(self) -> float | None:
        bound = self.layer.call_timeout
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0
        ):
            self._wrong("call_timeout", bound, "None or seconds > 0")
        return None if bound is None else float(bound)

    def local_directory(self) -> Path | None:
        with self._translated("local directory", ""):
            where = self.layer.local_directory()
        if where is not None and not isinstance(where, Path):
            self._wrong("local_directory", where, "None or a pathlib.Path")
        return where

    def _text(self, method: str, value: object) -> str | None:
        """``value`` (None or a str), secrets masked; else the wrong answer raised."""
        if value is not None and not isinstance(value, str):
            self._wrong(method, value, "None or a str")
        return None if value is None else scrub(value, self.secrets)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._translated("close", ""):
            self.layer.close()

    # -- failures -----------------------------------------------------------------------------
    def _wrong(self, method: str, value: object, expected: str) -> NoReturn:
        raise PlanStoreError(
            f"{self.origin}: {type(self.layer).__qualname__}.{method} gave "
            f"{type(value).__qualname__}, expected {expected}"
        )

    @contextlib.contextmanager
    def _translated(self, action: str, name: str) -> Iterator[None]:
        """OSError from the layer as a ``PlanStoreError`` subclass (see the module)."""
        try:
            yield
        except PlancacheError as exc:
            scrub_exception(exc, self.secrets)
            raise
        except OSError as exc:
            scrub_exception(exc, self.secrets)
            if isinstance(exc.strerror, str):  # str() of an OSError with errno shows this
                exc.strerror = scrub(exc.strerror, self.secrets)
            cls: type[PlanStoreError] = PlanStoreError
            if isinstance(exc, PermissionError):
                cls = PlanStorePermissionError
            elif isinstance(exc, (TimeoutError, ConnectionError)):
                cls = PlanStoreUnavailableError
            what = f"{action} {name!r}" if name else action
            detail = scrub(str(exc), self.secrets)
            raise cls(f"{self.origin}: {what} failed: {detail}", cause=exc) from exc
