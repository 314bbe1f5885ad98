"""Plans in a Google Cloud Storage bucket, through gcsfs's session and credentials.

- read: one media ``GET`` (body and ``x-goog-generation`` together, hit or miss), at most
  ``READ_LIMIT`` bytes.
- create: multipart upload with ``ifGenerationMatch=0``; replace: the same with
  ``ifGenerationMatch=<generation>``. A 412 means a racing writer won: the base class's
  merge loop re-reads.
- conditional delete: ``DELETE`` with ``ifGenerationMatch=<generation>`` (412 or 404: the
  record changed or is gone). fake-gcs-server ignores the precondition and deletes whatever
  is stored (the tests put ``GCSDeletePreconditions`` in front of it).
- time: ``connect_timeout`` 0.5 s and ``read_timeout`` 1 s per attempt, ``retries`` 1 (after
  a connection error, a timeout, 408, 429 or 5xx), ``timeout`` 3 s for a whole call; all four
  are storage options. (gcsfs itself has no request timeout and retries 6 times.)

``gcsfs.core.GCSFileSystem`` is used, not the package's default subclass, whose bucket-layout
call stalls against emulators and repeats without permissions. Other storage options go to it
(``token``, ``project``, ``endpoint_url``, ``session_kwargs``, ...); without
``endpoint_url``, ``STORAGE_EMULATOR_HOST`` or Google's endpoint is used.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterable, Mapping
from types import NoneType
from typing import Any

import aiohttp
from gcsfs.core import GCSFileSystem, quote
from google.auth.exceptions import GoogleAuthError

from plancache.backends._remote import (
    BODY_LIMIT,
    ERROR_BODY_LIMIT,
    ObjectStore,
    ResponseTooLargeError,
    client_option_names,
    read_bounded,
)
from plancache.errors import (
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)
from plancache.redaction import scrub, scrub_exception
from plancache.store import CONTENT_TYPE, READ_LIMIT

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
REASON_CHARS = 200
"""Most characters of an error body's message that an error shows."""


class GCSStatusError(Exception):
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


def _bucket_missing(reason: str) -> bool:
    lowered = reason.lower()
    return "bucket" in lowered and "no such object" not in lowered


class GCSStore(ObjectStore):
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
        api = self.fs.base  # "{endpoint}/storage/v1/"
        root = api[: -len("storage/v1/")]
        bucket = quote(self.bucket)
        self._objects = f"{api}b/{bucket}/o"
        self._download = f"{root}download/storage/v1/b/{bucket}/o"
        self._upload = f"{root}upload/storage/v1/b/{bucket}/o"
        self._opened = False

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
                        return r.status, r.headers, body
            except (TimeoutError, aiohttp.ClientConnectionError):
                if last:
                    raise
            await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    def endpoint(self) -> str:
        return str(self.fs.base)[: -len("storage/v1/")].rstrip("/")

    # -- primitives ----------------------------------------------------------------------
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        async def get() -> tuple[bytes, object] | None:
            url = f"{self._download}/{quote(self._key(fp))}"
            status, headers, body = await self._send(
                "GET", url, params={"alt": "media"}, limit=READ_LIMIT
            )
            if status == 404 and not _bucket_missing(_reason(body, self.secrets)):
                return None
            if status != 200:
                raise GCSStatusError(status, _reason(body, self.secrets))
            generation = headers.get("x-goog-generation")
            if generation is None:
                raise GCSStatusError(status, "the response carries no x-goog-generation")
            return body, int(generation)

        return self._run("read", get)

    def _upload_if_generation(
        self,
        fp: str,
        data: bytes,
        generation: int,
        *,
        key: str | None = None,
        content_type: str = CONTENT_TYPE,
    ) -> bool:
        """Multipart upload of ``data`` only if the object's generation is ``generation``
        (0: only if absent); False on 412. ``key``: another object than plan ``fp``'s."""
        boundary = f"plancache-{secrets.token_hex(16)}"
        name = self._key(fp) if key is None else key
        meta = json.dumps({"name": name, "contentType": content_type}).encode()
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

        return self._run("write", post)

    def _create(self, fp: str, data: bytes) -> bool:
        return self._upload_if_generation(fp, data, 0)

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        if not isinstance(version, int):
            raise TypeError(f"GCS versions are generations (int), got {type(version).__name__}")
        return self._upload_if_generation(fp, data, version)

    def _delete_object(self, fp: str, params: Mapping[str, str]) -> bool:
        """``DELETE`` the object with the preconditions ``params``; False if it is absent
        (or, with a precondition, on 412)."""

        async def delete() -> bool:
            url = f"{self._objects}/{quote(self._key(fp))}"
            status, _, body = await self._send("DELETE", url, params=params)
            missing = status == 404 and not _bucket_missing(_reason(body, self.secrets))
            if missing or (status == 412 and params):
                return False
            if status not in (200, 204):
                raise GCSStatusError(status, _reason(body, self.secrets))
            return True

        return self._run("delete", delete)

    def _delete_if(self, fp: str, version: object) -> bool:
        if not isinstance(version, int):
            raise TypeError(f"GCS versions are generations (int), got {type(version).__name__}")
        return self._delete_object(fp, {"ifGenerationMatch": str(version)})

    def _delete(self, fp: str) -> bool:
        return self._delete_object(fp, {})

    async def _list_page(self, token: str | None) -> tuple[list[str], str | None]:
        params = {
            "prefix": self._list_prefix,
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
