"""Plans in a Google Cloud Storage bucket, through gcsfs's session and credentials.

- read: one media ``GET`` (body and ``x-goog-generation`` together, hit or miss), at most
  the bytes asked; a stream (``open_object``) reads the body chunk by chunk.
- create: multipart upload with ``ifGenerationMatch=0``; replace: the same with
  ``ifGenerationMatch=<generation>``. Objects of one part (``PART_BYTES``) or more: a
  resumable upload started under the same precondition (cancelled on failure). A 412 means a racing
  writer won: the base class's merge loop re-reads.
- conditional delete: ``DELETE`` with ``ifGenerationMatch=<generation>`` (412 or 404: the
  record changed or is gone). fake-gcs-server ignores the precondition and deletes whatever
  is stored (the tests put ``GCSDeletePreconditions`` in front of it).
- time: ``connect_timeout`` 0.5 s and ``read_timeout`` 1 s per attempt, ``retries`` 1 (after
  a connection error, a timeout, 408, 429, 500, 502, 503 or 504), ``timeout`` 3 s for a whole
  call; all four are storage options. (gcsfs itself has no request timeout and retries 6 times.)

``gcsfs.core.GCSFileSystem`` is used, not the package's default subclass, whose bucket-layout
call stalls against emulators and repeats without permissions. Other storage options go to it
(``token``, ``project``, ``endpoint_url``, ``session_kwargs``, ...); without
``endpoint_url``, ``STORAGE_EMULATOR_HOST`` or Google's endpoint is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import secrets
from collections.abc import Iterable, Mapping
from types import NoneType
from typing import Any

import aiohttp
from gcsfs.core import GCSFileSystem, quote
from google.auth.exceptions import GoogleAuthError

from plancache._backends._remote import (
    BODY_LIMIT,
    ERROR_BODY_LIMIT,
    RemoteStore,
    ResponseTooLargeError,
    StreamReader,
    client_option_names,
    read_bounded,
)
from plancache._defaults import UPLOAD_CALL_S
from plancache._objects import CREATE, Opened, Update, WriteMode, parts
from plancache._redaction import scrub, scrub_exception
from plancache._store import CONTENT_TYPE
from plancache.errors import (
    PlancacheError,
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
REASON_CHARS = 200
"""Most characters of an error body's message that an error shows."""


class GCSStatusError(PlancacheError):
    """An unexpected HTTP status from the JSON API, with the server's one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}" if reason else f"HTTP {status}")
        self.status = status
        self.reason = reason


def _reason(body: bytes, secrets: Iterable[str]) -> str:
    """The ``error.message`` of a JSON error body (or its text), on one short line of
    printable ASCII: ``secrets`` masked, any other character escaped (``\\x1b``,
    ``\\u202e``), at most ``REASON_CHARS`` characters."""
    text = body.decode("utf-8", "replace")
    try:
        error = json.loads(text)["error"]
        text = str(error.get("message", "") if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    text = scrub(" ".join(text.split()), secrets)
    ascii_text = (c if " " <= c <= "~" else c.encode("unicode_escape").decode() for c in text)
    return "".join(ascii_text)[:REASON_CHARS]


def _generation(headers: Mapping[str, str], status: int) -> int:
    """The ``x-goog-generation`` of a read's answer (the object's version token)."""
    generation = headers.get("x-goog-generation")
    if generation is None or not generation.isdigit():
        raise GCSStatusError(status, "the response carries no x-goog-generation")
    return int(generation)


class GCSStore(RemoteStore):
    """``gs://bucket/prefix``: atomic create and compare-and-swap on object generations."""

    accepted_options = client_option_names(GCSFileSystem.__init__)

    def __init__(self, url: str, **storage_options: Any) -> None:
        super().__init__(url, storage_options)
        try:  # a raw token is checked here, over the network
            self.fs = GCSFileSystem(skip_instance_cache=True, **self.client_options)
        except (GoogleAuthError, ValueError, OSError) as exc:
            kind = (
                PlanStoreUnavailableError if isinstance(exc, OSError) else PlanStorePermissionError
            )
            message = scrub(f"{type(exc).__name__}: {exc}", self._secrets)
            raise scrub_exception(
                kind(f"{self.url}: open: cannot use the credentials: {message:.300}", cause=exc),
                self._secrets,
            ) from exc
        self._http_timeout = aiohttp.ClientTimeout(
            sock_connect=self.timeouts.connect, sock_read=self.timeouts.read
        )
        self._stream_timeout = aiohttp.ClientTimeout(
            sock_connect=self.timeouts.connect, sock_read=max(self.timeouts.read, UPLOAD_CALL_S)
        )
        api = self.fs.base  # "{endpoint}/storage/v1/"
        root = api[: -len("storage/v1/")]
        bucket = quote(self.bucket)
        self._objects = f"{api}b/{bucket}/o"
        self._download = f"{root}download/storage/v1/b/{bucket}/o"
        self._upload = f"{root}upload/storage/v1/b/{bucket}/o"
        self._opened = False
        self._bucket_seen = False
        """An answer only an existing bucket gives came (a 2xx, a failed precondition)."""

    async def _send(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request (plus at most ``retries`` after transport or server errors): status,
        headers and body. A successful body is cut at ``limit`` bytes when given (the caller
        judges a cut one, e.g. a plan over the size limit), else one over ``BODY_LIMIT``
        raises ``ResponseTooLargeError``; an error body is cut at ``ERROR_BODY_LIMIT``. The
        rest of a body is never read."""
        session = await self.fs._set_session()
        self._opened = True
        for attempt in range(self.timeouts.retries + 1):
            last = attempt == self.timeouts.retries
            all_headers = dict(headers or {})
            self.fs.credentials.apply(all_headers)
            self.resolved(all_headers.get("authorization", "").partition(" ")[2])
            try:
                async with session.request(
                    method,
                    url,
                    params=params,
                    headers=all_headers,
                    data=data,
                    timeout=self._http_timeout,
                ) as r:
                    ok = r.status < 300
                    cap = ERROR_BODY_LIMIT if not ok else BODY_LIMIT if limit is None else limit
                    body = await read_bounded(r.content.read, cap + 1)
                    if len(body) > cap:
                        r.close()  # drops the connection: the rest is never read
                        if ok and limit is None:
                            raise ResponseTooLargeError(cap)
                        body = body[:cap]
                    if r.status not in RETRY_STATUS or last:
                        self._bucket_seen |= ok or r.status == 412
                        return r.status, r.headers, body
            except (TimeoutError, aiohttp.ClientConnectionError):
                if last:
                    raise
            await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    async def _absent(self, status: int) -> bool:
        """True where ``status``, an object's answer, says the object is absent; False for
        any other status. GCS answers 404 for a missing bucket too, with nothing but its
        message's text to tell them apart: the bucket is known to exist (an earlier answer
        proved it), else one listing of a single name under the prefix decides (a listing
        names no object: its 404 is the bucket's; a missing bucket raises
        ``GCSStatusError(404)``, ``PlanStoreNotFoundError`` once translated). So a store's
        first miss, before any answer proved the bucket, costs one request more."""
        if status != 404:
            return False
        if not self._bucket_seen:
            params = {"prefix": self._list_prefix, "maxResults": "1", "fields": "nextPageToken"}
            listed, _, body = await self._send("GET", self._objects, params=params)
            if listed != 200:
                raise GCSStatusError(listed, _reason(body, self.secrets))
        return True

    def credential_source(self) -> str:
        method = getattr(getattr(self.fs, "credentials", None), "method", None)
        return f"gcsfs: {method or 'unknown'}"

    def endpoint(self) -> str:
        return str(self.fs.base)[: -len("storage/v1/")].rstrip("/")

    # -- the object layer -----------------------------------------------------------------
    def _url(self, base: str, name: str) -> str:
        return f"{base}/{quote(self._key(name))}"

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        """One media ``GET``: at most ``limit`` bytes, and the generation."""

        async def get() -> tuple[bytes, object] | None:
            url = self._url(self._download, name)
            status, headers, body = await self._send(
                "GET", url, params={"alt": "media"}, limit=limit
            )
            if await self._absent(status):
                return None
            if status != 200:
                raise GCSStatusError(status, _reason(body, self.secrets))
            return body, _generation(headers, status)

        return self._run("read", get)

    def open_object(self, name: str) -> Opened | None:
        async def get() -> Any:
            session = await self.fs._set_session()
            self._opened = True
            headers: dict[str, str] = {}
            self.fs.credentials.apply(headers)
            r = await session.get(
                self._url(self._download, name),
                params={"alt": "media"},
                headers=headers,
                timeout=self._stream_timeout,
            )
            if r.status == 200:
                self._bucket_seen = True
                return r
            body = await r.content.read(ERROR_BODY_LIMIT)
            r.release()
            if await self._absent(r.status):
                return None
            raise GCSStatusError(r.status, _reason(body, self.secrets))

        response = self._run("read", get)
        if response is None:
            return None
        try:
            generation = _generation(response.headers, response.status)
        except GCSStatusError:
            response.close()
            raise
        return Opened(StreamReader(self, response.content.read, response.close), generation)

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        """Under one part (``PART_BYTES``): a multipart upload with ``ifGenerationMatch`` (0 to
        create). One part or more: a resumable upload started with the same precondition,
        cancelled on any failure."""
        generation = 0 if not isinstance(mode, Update) else mode.version
        if not isinstance(generation, int):
            raise TypeError(f"GCS versions are generations (int), got {type(generation).__name__}")
        stream = parts(chunks)
        data = next(stream)
        following = next(stream, None)
        if following is None:
            return self._upload_if_generation(name, data, generation)
        session_url = self._run("write", functools.partial(self._start_upload, name, generation))
        if not session_url:
            return False
        offset = 0
        try:
            for part in itertools.chain((following,), stream):
                self._put_part(session_url, data, offset, None)  # not the last: total unknown
                offset += len(data)
                data = part
            return self._put_part(session_url, data, offset, offset + len(data))
        except BaseException:
            self._cancel(session_url)
            raise

    def _content_type(self, name: str) -> str:
        return CONTENT_TYPE if name.endswith(".json") else "application/octet-stream"

    def _upload_if_generation(self, name: str, data: bytes, generation: int) -> bool:
        """Multipart upload of ``data`` only if the object's generation is ``generation``
        (0: only if absent); False on 412."""
        boundary = f"plancache-{secrets.token_hex(16)}"
        content_type = self._content_type(name)
        meta = json.dumps({"name": self._key(name), "contentType": content_type}).encode()
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                meta,
                f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )

        async def post() -> bool:
            status, _, reply = await self._send(
                "POST",
                self._upload,
                params={"uploadType": "multipart", "ifGenerationMatch": str(generation)},
                headers={"Content-Type": f"multipart/related; boundary={boundary}"},
                data=body,
            )
            if status == 412:
                return False
            if status != 200:
                raise GCSStatusError(status, _reason(reply, self.secrets))
            return True

        return self._run("write", post, UPLOAD_CALL_S if len(data) > BODY_LIMIT else None)

    async def _start_upload(self, name: str, generation: int) -> str:
        """A resumable upload's session URL; ``""`` if the precondition failed."""
        meta = {"name": self._key(name), "contentType": self._content_type(name)}
        status, headers, body = await self._send(
            "POST",
            self._upload,
            params={"uploadType": "resumable", "ifGenerationMatch": str(generation)},
            headers={"Content-Type": "application/json; charset=UTF-8"},
            data=json.dumps(meta).encode(),
        )
        if status == 412:
            return ""
        if status != 200 or "Location" not in headers:
            raise GCSStatusError(status, _reason(body, self.secrets))
        return str(headers["Location"])

    def _put_part(self, url: str, data: bytes, offset: int, total: int | None) -> bool:
        """One chunk of a resumable upload (``total``: the size, given with the last one).
        True once the object is written, False on 412 (the precondition failed)."""
        end = f"{offset + len(data) - 1}" if data else ""
        span = f"bytes {offset}-{end}" if data else "bytes *"
        content_range = f"{span}/{'*' if total is None else total}"

        async def put() -> bool:
            status, _, body = await self._send(
                "PUT", url, headers={"Content-Range": content_range}, data=data
            )
            if status == 412:
                return False
            if (total is None and status == 308) or (total is not None and status in (200, 201)):
                return True
            raise GCSStatusError(status, _reason(body, self.secrets))

        written: bool = self._run("write", put, UPLOAD_CALL_S)
        return written

    def _cancel(self, url: str) -> None:
        async def cancel() -> None:
            await self._send("DELETE", url)

        with contextlib.suppress(Exception):
            self._run("write", cancel)

    def delete_object(self, name: str, version: object | None = None) -> bool:
        """``DELETE``, with ``ifGenerationMatch`` when ``version`` is given (412 or 404:
        changed or gone)."""
        if version is not None and not isinstance(version, int):
            raise TypeError(f"GCS versions are generations (int), got {type(version).__name__}")
        params = {} if version is None else {"ifGenerationMatch": str(version)}

        async def delete() -> bool:
            status, _, body = await self._send(
                "DELETE", self._url(self._objects, name), params=params
            )
            if await self._absent(status) or (status == 412 and params):
                return False
            if status not in (200, 204):
                raise GCSStatusError(status, _reason(body, self.secrets))
            return True

        return self._run("delete", delete)

    async def _list_page(self, token: str | None, prefix: str) -> tuple[list[str], str | None]:
        params = {
            "prefix": prefix,
            "delimiter": "/",
            "fields": "items/name,nextPageToken",
            "maxResults": str(self.list_page_size),
        }
        if token:
            params["pageToken"] = token
        status, _, body = await self._send("GET", self._objects, params=params)
        if status != 200:
            raise GCSStatusError(status, _reason(body, self.secrets))
        try:
            out = json.loads(body)
            names = [i["name"] for i in out.get("items", [])]
            token = out.get("nextPageToken")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self.unexpected("list", type(exc).__name__) from exc
        if not all(isinstance(n, str) for n in names) or not isinstance(token, (str, NoneType)):
            raise self.unexpected("list", "names and page tokens must be strings")
        return names, token or None

    def close(self) -> None:
        """Close the HTTP session (a later call opens a new one)."""
        if self._opened:
            self._opened = False
            session, self.fs._session = self.fs._session, None
            if session is not None:
                self._run("close", session.close)

    # -- errors --------------------------------------------------------------------------
    def translate(self, exc: Exception, action: str) -> PlanStoreError | None:
        where = f"{self.url}: {action}"
        if isinstance(exc, GCSStatusError):
            if exc.status in (401, 403):
                return PlanStorePermissionError(f"{where}: access denied: {exc}", cause=exc)
            if exc.status == 404:
                return PlanStoreNotFoundError(
                    f"{where}: bucket {self.bucket!r} does not exist", cause=exc
                )
            if exc.status in RETRY_STATUS:
                return PlanStoreUnavailableError(f"{where}: server error: {exc}", cause=exc)
            return PlanStoreError(f"{where}: {exc}", cause=exc)
        if isinstance(exc, GoogleAuthError):
            return PlanStorePermissionError(
                f"{where}: no usable credentials ({type(exc).__name__})", cause=exc
            )
        if isinstance(exc, asyncio.TimeoutError):
            return PlanStoreUnavailableError(
                f"{where}: timed out ({type(exc).__name__})", cause=exc
            )
        if isinstance(exc, (aiohttp.ClientError, OSError)):
            return PlanStoreUnavailableError(
                f"{where}: cannot reach the endpoint ({type(exc).__name__})", cause=exc
            )
        return None
