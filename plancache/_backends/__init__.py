"""Backend registry: URL scheme -> implementation, imported lazily (the way fsspec does it).

Importing this package imports no client library; ``s3fs`` and ``gcsfs`` load only when a
URL of their scheme is opened.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from plancache._redaction import scrub_exception, secret_values
from plancache._store import PlanStore
from plancache.errors import MissingExtraError, UnknownSchemeError, UnsupportedStoreError

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


def _scheme(url: str) -> str:
    if "://" not in url:
        return "file"
    return urlsplit(url).scheme.lower()


def _supported() -> str:
    return ", ".join(f"{s}://" for s in sorted(BACKENDS)) + ", memory:// and other fsspec protocols"


def _load(target: str, extra: str | None, scheme: str) -> Callable[..., PlanStore]:
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None or (exc.name or "").startswith("plancache"):
            raise
        raise MissingExtraError(
            f"{scheme}:// stores need {exc.name!r}: pip install 'plancache[{extra}]'", cause=exc
        ) from exc
    cls: Callable[..., PlanStore] = getattr(module, cls_name)
    return cls


def open_store(url: str | None = None, **storage_options: Any) -> PlanStore:
    """Open the store a URL names: a local path or ``file://`` URL, ``s3://bucket/prefix``,
    ``gs://bucket/prefix``, or another fsspec URL. None means the local default directory.

    This is the bare backend: it honours none of the ``PLANCACHE_*`` settings (no local tier,
    no signing keys, no read-only mode). ``PlanCache.from_env()`` and
    ``plancache._config.Settings.from_env().open_store()`` honour all of them.

    Raises ``UnsupportedStoreError`` (a ``ValueError``) for an unknown scheme or a missing
    extra or package, naming the supported schemes or the ``pip install`` that fixes it.
    """
    from plancache._backends.local import LocalStore

    if url is not None and not url.strip():
        raise UnsupportedStoreError("empty store URL: give a path or URL (None: the default)")
    if url is None or _scheme(url) == "file":
        if storage_options:
            raise UnsupportedStoreError(
                f"local stores take no storage options, got {sorted(storage_options)}"
            )
        return LocalStore(None if url is None else _local_path(url))
    scheme = _scheme(url)
    if scheme in BACKENDS:
        target, extra = BACKENDS[scheme]
    else:
        from fsspec.registry import known_implementations, registry

        if scheme not in known_implementations and scheme not in registry:
            raise UnknownSchemeError(f"unknown store scheme {scheme!r}; supported: {_supported()}")
        target, extra = GENERIC, None
    cls = _load(target, extra, scheme)
    try:
        return cls(url, **storage_options)
    except ImportError as exc:  # fsspec loads a protocol's package only now
        raise _missing_package(scheme, exc) from exc
    except Exception as exc:  # whatever the client raised, it carries no secret out
        scrub_exception(exc, secret_values({"url": url, **storage_options}))
        raise


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
    if url.startswith("file://"):
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise UnsupportedStoreError(f"file:// URL names a remote host: {url!r}")
        return parts.path
    return url
