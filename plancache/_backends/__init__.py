"""Backend registry: URL scheme -> implementation, imported lazily (the way fsspec does it).

Importing this package imports no client library; ``s3fs`` and ``gcsfs`` load only when a
URL of their scheme is opened.

A scheme is served by, in this order: a backend registered in this process
(``register_backend``, the public function), a built-in one (``BACKENDS``), one declared in
the ``plancache.backends`` entry-point group (name: the scheme; value: ``"module:attr"``),
read on the first URL of a scheme neither of those serves (again whenever ``sys.path``
changed since), and last any other protocol fsspec knows (``GENERIC``). A registered factory
returns an ``ObjectLayer``, wrapped in a ``CheckedLayer`` (``plancache._backends.layer``);
every kind, plans included, is built on the layer (``open_layer``) by composition.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from plancache._objects import ObjectLayer
from plancache._redaction import scrub_exception, secret_values
from plancache._store import PlanStore
from plancache.errors import (
    ConfigError,
    MissingExtraError,
    UnknownSchemeError,
    UnsupportedStoreError,
)

log = logging.getLogger("plancache")

#: scheme -> ("module:Class", extra that installs its client library or None)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "file": ("plancache._backends.local:LocalStore", None),
    "s3": ("plancache._backends.s3:S3Store", "s3"),
    "s3a": ("plancache._backends.s3:S3Store", "s3"),
    "gs": ("plancache._backends.gcs:GCSStore", "gcs"),
    "gcs": ("plancache._backends.gcs:GCSStore", "gcs"),
}
#: any other protocol fsspec knows goes to the generic backend
GENERIC = "plancache._backends.generic:FsspecStore"
ENTRY_POINT_GROUP = "plancache.backends"
"""The entry-point group third-party backends are declared in (name: scheme; value:
``"module:attr"``, a factory as ``register_backend`` takes)."""
REGISTERED = "register_backend"
"""The origin of a backend registered by ``register_backend``."""
LOCAL_SCHEME = "file"
"""Local paths and ``file://`` URLs: the local directory store, never replaced."""

Factory = Callable[..., ObjectLayer]
"""A backend: called as ``factory(url, **storage_options)``, returns an ``ObjectLayer``."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")
"""A URL scheme (RFC 3986), at most 32 characters."""
_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""``"module:attr"`` (dotted names on both sides), as entry points write them."""


@dataclass(frozen=True)
class Backend:
    """What serves a scheme: ``factory`` (a callable, or ``"module:attr"`` imported on first
    use), the pip extra that installs its client library (built-ins only), and where it
    came from, for messages."""

    scheme: str
    factory: str | Factory
    extra: str | None = None
    origin: str = "built-in"

    def describe(self) -> str:
        """``"memtest:// (pkg.mod:Layer, entry point of mypkg 1.0)"``: for messages."""
        target = self.factory if isinstance(self.factory, str) else _qualname(self.factory)
        return f"{self.scheme}:// ({target}, {self.origin})"


_lock = threading.Lock()
_registered: dict[str, Backend] = {}
"""Backends registered in this process (``register_backend`` or entry points)."""
_scanned_path: tuple[str, ...] | None = None
"""``sys.path`` when the entry points were last read (None: never)."""


def _qualname(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}:{name}" if module else str(name)


ACCEPTED_FORMS = (
    "a local path (/data/store, ./store), file:///data/store, s3://bucket/prefix, "
    "gs://bucket/prefix, or SCHEME://... for a registered backend or another fsspec protocol"
)
"""The forms of a store URL, named by every error that refuses one."""
_SCHEME_PREFIX = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}):")
"""What starts a URL with a scheme (``s3:``): it must go on with ``//``."""


def url_scheme(url: str) -> str:
    """The scheme of store URL ``url`` (lowercased; ``file`` for a local path), parsed
    strictly, here only: text that starts like a scheme (``s3:``, ``file:``, ``gs:``) but
    does not go on with ``//`` is ``UnsupportedStoreError`` naming the accepted forms, never
    a relative local path (``s3:/fleet/caches`` would write ``./s3:/fleet/caches``); a local
    path with such a colon is written ``./name:...``. An empty URL is refused too."""
    if not url.strip():
        raise UnsupportedStoreError(f"empty store URL: give {ACCEPTED_FORMS}")
    match = _SCHEME_PREFIX.match(url)
    if match is None:
        return "file"
    if not url.startswith("//", match.end()):
        scheme = match.group(1)
        raise UnsupportedStoreError(
            f"store URL {url.rpartition('@')[2]!r:.200}: {scheme + ':'!r} is not followed by "
            f"'//' (meant {scheme}://...?); give {ACCEPTED_FORMS} (a local path with a "
            "colon: ./name:...)"
        )
    return match.group(1).lower()


def check_url(url: str) -> str:
    """``url`` if some backend serves it (``url_scheme``, then the registry: registered,
    built-in, entry point, fsspec protocol); else ``UnsupportedStoreError`` (an unknown
    scheme: ``UnknownSchemeError``) naming the accepted forms. Imports no client library."""
    scheme = url_scheme(url)
    if scheme != LOCAL_SCHEME and _backend(scheme) is None:
        from fsspec.registry import known_implementations, registry

        if scheme not in known_implementations and scheme not in registry:
            raise UnknownSchemeError(
                f"unknown store scheme {scheme!r}: give {ACCEPTED_FORMS} (served here: "
                f"{_supported()})"
            )
    return url


def _check_scheme(scheme: object) -> str:
    """``scheme`` lowercased (URL schemes are case-insensitive); else ``ConfigError``."""
    if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme):
        hint = (
            " (give the scheme without '://')" if isinstance(scheme, str) and ":" in scheme else ""
        )
        raise ConfigError(
            f"not a URL scheme: {scheme!r:.60}{hint}: a letter, then letters, digits, '+', "
            "'-' or '.', at most 32 characters"
        )
    return scheme.lower()


def _same(a: str | Factory, b: str | Factory) -> bool:
    return a == b if isinstance(a, str) or isinstance(b, str) else a is b


def register_backend(scheme: str, factory: str | Factory, *, clobber: bool = False) -> None:
    """Serve URLs of ``scheme`` (``"memtest"`` for ``memtest://...``) with ``factory``, in
    this process, for ``open_store``, ``Settings.open_store()``, ``PlanCache.from_env()`` and
    every kind (plans, compile artifacts, cache bundles).

    ``factory``: a callable ``factory(url, **storage_options) -> ObjectLayer`` (a class
    deriving from ``plancache.ObjectLayer``, or a function returning one), or its
    ``"module:attr"`` path, imported on first use (so registering costs no import). What it
    returns is wrapped in a layer that checks its answers (``CheckedLayer``), and every
    kind is built on it.

    Like fsspec's ``register_implementation``: registering the same factory again does
    nothing; another factory for a scheme already served (registered, or built-in: ``s3``,
    ``s3a``, ``gs``, ``gcs``) raises ``ConfigError`` unless ``clobber=True``. Registering a
    built-in scheme's own ``"module:Class"`` with ``clobber=True`` restores the built-in.
    ``file`` (local paths) cannot be replaced. A scheme registered here wins over an entry
    point of the same name (whichever was read first) and over fsspec's protocol of that
    name. The registration lasts as long as the process: other processes (the ``plancache``
    command, vLLM's workers) see a scheme only if they register it too, or through the
    ``plancache.backends`` entry-point group.

    Raises ``ConfigError`` (a ``ValueError``) for a malformed scheme, a factory that is
    neither callable nor a ``"module:attr"`` string, or a taken scheme without ``clobber``.
    """
    name = _check_scheme(scheme)
    if isinstance(factory, str):
        if not _TARGET.fullmatch(factory):
            raise ConfigError(
                f"backend for {name}:// must be a callable or 'module:attr', got {factory!r:.80}"
            )
    elif not callable(factory):
        raise ConfigError(
            f"backend for {name}:// must be a callable or 'module:attr', got a "
            f"{type(factory).__qualname__}"
        )
    if name == LOCAL_SCHEME:
        raise ConfigError("file:// (local paths) is the local directory store: not replaceable")
    with _lock:
        current = _registered.get(name)
        if current is not None and current.origin != REGISTERED:
            current = None  # an entry point's: code in this process wins over it
        builtin = BACKENDS.get(name)
        if current is not None and _same(current.factory, factory):
            return
        if current is None and builtin is not None and _same(builtin[0], factory):
            return
        if (current is not None or builtin is not None) and not clobber:
            taken = current.describe() if current is not None else f"{name}:// (built-in)"
            raise ConfigError(
                f"{taken} is registered already; register_backend(..., clobber=True) replaces it"
            )
        if builtin is not None and _same(builtin[0], factory):
            _registered.pop(name, None)  # the built-in again
        else:
            _registered[name] = Backend(name, factory, origin=REGISTERED)


def _scan_entry_points() -> None:
    """Register the ``plancache.backends`` entry points, once per state of ``sys.path``.
    Malformed ones and those naming a scheme already served are skipped with a warning
    (a scheme registered in this process wins silently)."""
    global _scanned_path
    path = tuple(sys.path)
    if _scanned_path == path:
        return
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINT_GROUP)
    with _lock:
        _scanned_path = path
        for ep in found:
            dist = getattr(ep, "dist", None)
            origin = "entry point" + (f" of {dist.name} {dist.version}" if dist else "")
            if not _SCHEME.fullmatch(ep.name) or not _TARGET.fullmatch(ep.value.strip()):
                log.warning(
                    "plancache: %s %s = %r skipped: a scheme and 'module:attr' expected",
                    origin,
                    ep.name,
                    ep.value,
                )
                continue
            scheme, target = ep.name.lower(), ep.value.strip()
            current = _registered.get(scheme)
            if current is not None:
                if current.origin != REGISTERED and not _same(current.factory, target):
                    log.warning(
                        "plancache: %s %s = %s skipped: %s serves it",
                        origin,
                        scheme,
                        target,
                        current.describe(),
                    )
                continue
            if scheme in BACKENDS:
                log.warning(
                    "plancache: %s %s = %s skipped: %s:// is built in "
                    "(register_backend(..., clobber=True) replaces it)",
                    origin,
                    scheme,
                    target,
                    scheme,
                )
                continue
            _registered[scheme] = Backend(scheme, target, origin=origin)


def _backend(scheme: str) -> Backend | None:
    """What serves ``scheme`` (see the module), or None where only fsspec might."""
    for attempt in range(2):
        with _lock:
            if scheme in _registered:
                return _registered[scheme]
            if scheme in BACKENDS:
                target, extra = BACKENDS[scheme]
                return Backend(scheme, target, extra)
        if attempt == 0:
            _scan_entry_points()
    return None


def _supported() -> str:
    with _lock:
        schemes = sorted(set(BACKENDS) | set(_registered))
    return ", ".join(f"{s}://" for s in schemes) + ", memory:// and other fsspec protocols"


def _load(backend: Backend) -> Factory:
    """The backend's factory, imported where it is a ``"module:attr"`` path; else
    ``MissingExtraError`` (a built-in's client library) or ``UnsupportedStoreError``."""
    if not isinstance(backend.factory, str):
        return backend.factory
    target, scheme, extra = backend.factory, backend.scheme, backend.extra
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if backend.origin == "built-in":
            if extra is None or (exc.name or "").startswith("plancache"):
                raise
            raise MissingExtraError(
                f"{scheme}:// stores need {exc.name!r}: pip install 'plancache[{extra}]'",
                cause=exc,
            ) from exc
        raise UnsupportedStoreError(
            f"{backend.describe()} cannot be imported: {exc}", cause=exc
        ) from exc
    except Exception as exc:
        raise UnsupportedStoreError(
            f"{backend.describe()} cannot be imported: {type(exc).__name__}: {exc}", cause=exc
        ) from exc
    obj: object = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise UnsupportedStoreError(
            f"{backend.describe()} cannot be imported: {module_name} has no {attr!r}", cause=exc
        ) from exc
    if not callable(obj):
        raise UnsupportedStoreError(
            f"{backend.describe()} is a {type(obj).__qualname__}, not a callable"
        )
    factory: Factory = obj
    return factory


def open_store(url: str | None = None, **storage_options: Any) -> PlanStore:
    """The plans kind (``PlanStore``) on the object layer a URL names (``open_layer``).

    This is the bare backend: it honours none of the ``PLANCACHE_*`` settings (no local tier,
    no signing keys, no read-only mode). ``PlanCache.from_env()`` and
    ``plancache._config.Settings.from_env().open_store()`` honour all of them. Raises what
    ``open_layer`` raises.
    """
    return PlanStore(open_layer(url, **storage_options))


def open_layer(url: str | None = None, **storage_options: Any) -> ObjectLayer:
    """Open the object layer a URL names: a local path or ``file://`` URL,
    ``s3://bucket/prefix``, ``gs://bucket/prefix``, a scheme registered with
    ``register_backend`` or the ``plancache.backends`` entry points (wrapped in a
    ``CheckedLayer``), or another fsspec URL. None means the local default directory.

    Raises ``UnsupportedStoreError`` (a ``ValueError``) for an unknown scheme or a missing
    extra or package, naming the supported schemes or the ``pip install`` that fixes it, and
    for a registered backend that cannot be imported or returns no ``ObjectLayer``, naming it.
    """
    from plancache._backends.local import LocalStore

    if url is None or url_scheme(check_url(url)) == LOCAL_SCHEME:
        if storage_options:
            raise UnsupportedStoreError(
                f"local stores take no storage options, got {sorted(storage_options)}"
            )
        return LocalStore(None if url is None else _local_path(url))
    scheme = url_scheme(url)
    backend = _backend(scheme) or Backend(scheme, GENERIC)
    factory = _load(backend)
    secrets = list(secret_values({"url": url, **storage_options}))
    try:
        made = factory(url, **storage_options)
    except ImportError as exc:  # fsspec loads a protocol's package only now
        raise _missing_package(scheme, exc) from exc
    except Exception as exc:  # whatever the client raised, it carries no secret out
        scrub_exception(exc, secrets)
        raise
    if not isinstance(made, ObjectLayer):
        raise UnsupportedStoreError(
            f"{backend.describe()} returned a {type(made).__qualname__}, not a "
            "plancache.ObjectLayer"
        )
    if backend.origin == "built-in":
        return made
    from plancache._backends.layer import CheckedLayer

    return CheckedLayer(made, backend.describe(), secrets)


def _missing_package(scheme: str, exc: ImportError) -> MissingExtraError:
    """The error for a protocol whose package is not installed, naming the package (the
    top-level name of the missing module: ``adlfs``, ``paramiko``, ...)."""
    chain = (exc, exc.__cause__, exc.__context__)
    names = [e.name for e in chain if isinstance(e, ImportError) and e.name]
    if not names:
        return MissingExtraError(f"{scheme}:// stores need a package: {exc}", cause=exc)
    package = names[0].partition(".")[0]
    return MissingExtraError(
        f"{scheme}:// stores need {package!r}: pip install {package}", cause=exc
    )


def _local_path(url: str) -> str:
    if _SCHEME_PREFIX.match(url):  # file://, in any case (url_scheme checked it)
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise UnsupportedStoreError(f"file:// URL names a remote host: {url!r}")
        return parts.path
    return url
