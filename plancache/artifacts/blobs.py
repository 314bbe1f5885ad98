"""Streamed objects (artifacts) in a local directory, an S3 bucket or a GCS bucket.

Every backend offers the same four operations on base names:

- ``open(name)``: a reader whose ``read(n)`` returns the next bytes (``b""`` at the end), or
  None if there is no such object; each read is bounded in time (the store's call bound).
- ``create(name, chunks)``: write the object from an iterator of chunks, only if it does not
  exist yet; True if this call created it, False if it existed or a racing writer won
  (never an error). Nothing is visible before the last chunk: an iterator that raises, or a
  process killed mid-stream, leaves no object (local: a temp file then ``link``; S3: a
  ``PutObject``, or a multipart upload completed with ``If-None-Match: *``, aborted on
  failure; GCS: a resumable upload started with ``ifGenerationMatch=0``, cancelled on
  failure). Memory stays within one part (``PART_BYTES``) whatever the object's size.
- ``delete(name)`` and ``names()``.

Failures raise ``PlanStoreError`` subclasses, as the plan stores do.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import socket
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from plancache.artifacts.manifest import parse_object_name
from plancache.errors import PlanStoreError, PlanStorePermissionError, PlanStoreUnavailableError

if TYPE_CHECKING:
    from plancache.backends._remote import ObjectStore

if TYPE_CHECKING:
    from plancache.backends.gcs import GCSStore
    from plancache.backends.s3 import S3Store

PART_BYTES = 8 << 20
"""Bytes buffered per upload part (S3's minimum part is 5 MiB; GCS wants 256 KiB multiples)."""
UPLOAD_CALL_S = 120.0
"""Bound on one part's upload (the store's own call bound is sized for small plans)."""
CONTENT_TYPE = "application/x-tar"


class Reader(Protocol):
    def read(self, n: int, /) -> bytes: ...

    def close(self) -> None: ...


class Blobs(ABC):
    """Artifacts as objects of one store (see the module docstring)."""

    url: str

    @abstractmethod
    def open(self, name: str) -> Reader | None: ...

    @abstractmethod
    def create(self, name: str, chunks: Iterable[bytes]) -> bool: ...

    @abstractmethod
    def delete(self, name: str) -> bool: ...

    @abstractmethod
    def names(self) -> Iterator[str]: ...

    def close(self) -> None:
        """Release the client's connections (optional)."""


def _parts(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks`` regrouped into parts of ``PART_BYTES`` (the last one may be shorter)."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= PART_BYTES:
            yield bytes(buffer[:PART_BYTES])
            del buffer[:PART_BYTES]
    yield bytes(buffer)


# -- local directory -------------------------------------------------------------------------
class LocalBlobs(Blobs):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def open(self, name: str) -> Reader | None:
        try:
            fd = os.open(self.root / name, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _local_error(self.root / name, "read", exc) from exc
        return os.fdopen(fd, "rb")

    def create(self, name: str, chunks: Iterable[bytes]) -> bool:
        final = self.root / name
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(
                dir=self.root,
                prefix=f".{name}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.",
                suffix=".tmp",
            )
        except OSError as exc:
            raise _local_error(final, "write", exc) from exc
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, 0o644)
            try:
                os.link(temp, final)
            except FileExistsError:
                return False
            return True
        except OSError as exc:
            raise _local_error(final, "write", exc) from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def delete(self, name: str) -> bool:
        try:
            os.unlink(self.root / name)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _local_error(self.root / name, "delete", exc) from exc
        return True

    def names(self) -> Iterator[str]:
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            raise _local_error(self.root, "list", exc) from exc
        return iter(sorted(n for n in entries if parse_object_name(n) is not None))


def _local_error(path: Path, action: str, exc: OSError) -> PlanStoreError:
    kind = PlanStorePermissionError if isinstance(exc, PermissionError) else PlanStoreError
    return kind(f"{path}: {action}: {exc.strerror or type(exc).__name__}", cause=exc)


# -- S3 --------------------------------------------------------------------------------------
class _AsyncReader:
    """A streamed response body read chunk by chunk on the store's loop, each read bounded
    by the store's call bound."""

    def __init__(self, store: Any, body: Any, read: Any, close: Any) -> None:
        self.store, self.body, self._read, self._close = store, body, read, close

    def read(self, n: int, /) -> bytes:
        async def chunk() -> bytes:
            data: bytes = await self._read(n)
            return data

        return self.store._run("read", chunk)  # type: ignore[no-any-return]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._close()


class _ObjectBlobs(Blobs):
    """Artifacts beside the plans of an object store (same bucket and prefix)."""

    store: ObjectStore

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.url = store.url

    def _key(self, name: str) -> str:
        return f"{self.store.prefix}/{name}" if self.store.prefix else name

    def names(self) -> Iterator[str]:
        return _object_names(self.store)

    def close(self) -> None:
        self.store.close()


class S3Blobs(_ObjectBlobs):
    store: S3Store

    def open(self, name: str) -> Reader | None:
        from botocore.exceptions import ClientError

        from plancache.backends.s3 import _missing_key

        async def get() -> Any:
            s3 = await self.store._client()
            try:
                resp = await s3.get_object(Bucket=self.store.bucket, Key=self._key(name))
            except ClientError as exc:
                if _missing_key(exc):
                    return None
                raise
            return resp["Body"]

        body = self.store._run("read", get)
        if body is None:
            return None
        return _AsyncReader(self.store, body, body.read, body.close)

    def create(self, name: str, chunks: Iterable[bytes]) -> bool:
        store, key = self.store, self._key(name)
        extra = dict(store.fs.s3_additional_kwargs)
        parts = _parts(chunks)
        first = next(parts)
        second = next(parts, None)
        if second is None:  # one part: a conditional PutObject
            return self._if_absent(
                "put_object", Key=key, Body=first, ContentType=CONTENT_TYPE, **extra
            )

        async def start() -> str:
            s3 = await store._client()
            resp = await s3.create_multipart_upload(
                Bucket=store.bucket, Key=key, ContentType=CONTENT_TYPE, **extra
            )
            return str(resp["UploadId"])

        upload_id = store._run("write", start)
        done: list[dict[str, Any]] = []

        def send(number: int, data: bytes) -> None:
            async def part() -> None:
                s3 = await store._client()
                resp = await s3.upload_part(
                    Bucket=store.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
                )
                done.append({"PartNumber": number, "ETag": resp["ETag"]})

            store._run("write", part, UPLOAD_CALL_S)

        try:
            send(1, first)
            send(2, second)
            for number, data in enumerate(parts, 3):
                if data:
                    send(number, data)
            created = self._if_absent(
                "complete_multipart_upload",
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": done},
            )
        except BaseException:
            self._abort(key, upload_id)
            raise
        if not created:
            self._abort(key, upload_id)
        return created

    def _if_absent(self, call: str, **kwargs: Any) -> bool:
        """The client's ``call`` with ``If-None-Match: *``; False if the object existed or a
        racing writer won."""
        from botocore.exceptions import ClientError

        from plancache.backends.s3 import _lost_race

        async def conditional() -> bool:
            s3 = await self.store._client()
            try:
                await getattr(s3, call)(Bucket=self.store.bucket, IfNoneMatch="*", **kwargs)
            except ClientError as exc:
                if _lost_race(exc):
                    return False
                raise
            return True

        created: bool = self.store._run("write", conditional, UPLOAD_CALL_S)
        return created

    def _abort(self, key: str, upload_id: str) -> None:
        async def abort() -> None:
            s3 = await self.store._client()
            await s3.abort_multipart_upload(Bucket=self.store.bucket, Key=key, UploadId=upload_id)

        with contextlib.suppress(Exception):
            self.store._run("write", abort)

    def delete(self, name: str) -> bool:
        async def delete() -> bool:
            s3 = await self.store._client()
            await s3.delete_object(Bucket=self.store.bucket, Key=self._key(name))
            return True

        return self.store._run("delete", delete)


# -- GCS -------------------------------------------------------------------------------------
class GCSBlobs(_ObjectBlobs):
    store: GCSStore

    def _url(self, base: str, name: str) -> str:
        from gcsfs.core import quote

        return f"{base}/{quote(self._key(name))}"

    def open(self, name: str) -> Reader | None:
        from plancache.backends.gcs import GCSStatusError, _bucket_missing, _reason

        store = self.store

        async def get() -> Any:
            session = await store.fs._set_session()
            store._opened = True
            headers: dict[str, str] = {}
            store.fs.credentials.apply(headers)
            r = await session.get(
                self._url(store._download, name),
                params={"alt": "media"},
                headers=headers,
                timeout=store._http_timeout,
            )
            if r.status == 200:
                return r
            body = await r.content.read(8192)
            r.release()
            if r.status == 404 and not _bucket_missing(_reason(body, store.secrets)):
                return None
            raise GCSStatusError(r.status, _reason(body, store.secrets))

        response = store._run("read", get)
        if response is None:
            return None
        return _AsyncReader(store, response, response.content.read, response.close)

    def create(self, name: str, chunks: Iterable[bytes]) -> bool:
        from plancache.backends.gcs import GCSStatusError, _reason

        store = self.store

        async def start() -> str:
            status, headers, body = await store._send(
                "POST",
                store._upload,
                params={"uploadType": "resumable", "ifGenerationMatch": "0"},
                headers={"Content-Type": "application/json; charset=UTF-8"},
                data=json.dumps({"name": self._key(name), "contentType": CONTENT_TYPE}).encode(),
            )
            if status == 412:
                return ""
            if status != 200 or "Location" not in headers:
                raise GCSStatusError(status, _reason(body, store.secrets))
            return str(headers["Location"])

        parts = _parts(chunks)
        data = next(parts)
        following = next(parts, None)
        if following is None:  # one part: a multipart upload with ifGenerationMatch=0
            return store._upload_if_generation(
                "", data, 0, key=self._key(name), content_type=CONTENT_TYPE
            )
        session_url = store._run("write", start)
        if not session_url:
            return False
        offset = 0
        try:
            self._put_part(session_url, data, offset, None)
            offset += len(data)
            data = following
            for following in parts:  # data is not the last part: its total is unknown
                self._put_part(session_url, data, offset, None)
                offset += len(data)
                data = following
            created = self._put_part(session_url, data, offset, offset + len(data))
        except BaseException:
            self._cancel(session_url)
            raise
        return created

    def _put_part(self, url: str, data: bytes, offset: int, total: int | None) -> bool:
        """One chunk of a resumable upload (``total``: the size, given with the last one).
        True once the object is created, False on 412 (a racing writer won)."""
        from plancache.backends.gcs import GCSStatusError, _reason

        end = f"{offset + len(data) - 1}" if data else ""
        span = f"bytes {offset}-{end}" if data else "bytes *"
        content_range = f"{span}/{'*' if total is None else total}"

        async def put() -> bool:
            status, _, body = await self.store._send(
                "PUT", url, headers={"Content-Range": content_range}, data=data
            )
            if status == 412:
                return False
            if (total is None and status == 308) or (total is not None and status in (200, 201)):
                return True
            raise GCSStatusError(status, _reason(body, self.store.secrets))

        created: bool = self.store._run("write", put, UPLOAD_CALL_S)
        return created

    def _cancel(self, url: str) -> None:
        async def cancel() -> None:
            await self.store._send("DELETE", url)

        with contextlib.suppress(Exception):
            self.store._run("write", cancel)

    def delete(self, name: str) -> bool:
        from plancache.backends.gcs import GCSStatusError, _reason

        async def delete() -> bool:
            status, _, body = await self.store._send("DELETE", self._url(self.store._objects, name))
            if status == 404:
                return False
            if status not in (200, 204):
                raise GCSStatusError(status, _reason(body, self.store.secrets))
            return True

        return self.store._run("delete", delete)


def _object_names(store: ObjectStore) -> Iterator[str]:
    """The artifacts' base names under ``store``'s prefix, page by page (bounded as the
    plans' listing is: ``max_list_pages``)."""
    token: str | None = None
    for _ in range(store.max_list_pages):
        keys, token = store._run("list", functools.partial(store._list_page, token))
        for key in keys:
            base = key.rpartition("/")[2]
            if parse_object_name(base) is not None:
                yield base
        if token is None:
            return
    raise PlanStoreUnavailableError(f"{store.url}: list: more than {store.max_list_pages} pages")


def blobs_for(url: str, storage_options: dict[str, Any]) -> Blobs:
    """The artifacts' side of the store ``url`` names (same objects' prefix as the plans).
    ``UnsupportedStoreError`` for a scheme other than a local path, ``s3://`` or ``gs://``."""
    from plancache.backends import open_store
    from plancache.backends.local import LocalStore
    from plancache.errors import UnsupportedStoreError

    if "://" in url and not url.startswith("file://"):
        # a part's upload, or completing a large multipart upload, may take far longer than
        # the per-attempt read timeout sized for plans; every call stays bounded by its
        # total (reads: the store's ``timeout``; uploads: ``UPLOAD_CALL_S``)
        storage_options = {"read_timeout": UPLOAD_CALL_S, **storage_options}
    store = open_store(url, **storage_options)
    if isinstance(store, LocalStore):
        return LocalBlobs(store.root)
    scheme = getattr(store, "scheme", "")
    if scheme == "s3":
        return S3Blobs(store)  # type: ignore[arg-type]
    if scheme in ("gs", "gcs"):
        return GCSBlobs(store)  # type: ignore[arg-type]
    store.close()
    raise UnsupportedStoreError(
        f"{store.url}: compile artifacts need a local, s3:// or gs:// store"
    )
