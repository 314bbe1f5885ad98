"""Plans in an S3 bucket (or any S3-compatible store), through s3fs's aiobotocore client.

- read: one ``GetObject`` (body and ETag together, hit or miss), at most the bytes asked; a
  stream (``open_object``) reads the body chunk by chunk.
- create: ``PutObject`` with ``If-None-Match: *``; replace: ``PutObject`` with
  ``If-Match: <etag>``. Objects of one part (``PART_BYTES``) or more are multipart uploads
  completed under the same condition (aborted on failure; an object of exactly one part is
  that part and an empty second one, as ``plancache._objects.parts`` yields them). A 412,
  or AWS's 409 ``ConditionalRequestConflict``, means a racing writer won: the base class's
  merge loop re-reads.
- conditional delete: ``DeleteObject`` with ``If-Match: <etag>`` (AWS honours it in general
  purpose buckets since September 2025, and moto does; a 412 or 404 means the record changed
  or is gone). A service that ignores the header deletes whatever is stored.
- delete: ``HeadObject`` (to tell whether it was there), then ``DeleteObject``.
- time: ``connect_timeout`` 0.5 s and ``read_timeout`` 1 s per attempt, ``retries`` 1 (botocore
  ``standard`` mode), ``timeout`` 3 s for a whole call; all four are storage options.

Other storage options go to ``s3fs.S3FileSystem`` (``endpoint_url``, ``key``, ``secret``,
``anon``, ``client_kwargs``, ...); credentials otherwise come from botocore's chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import re
import threading
from collections.abc import Iterable
from typing import Any

import aiohttp
import s3fs
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

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
from plancache._store import CONTENT_TYPE
from plancache.errors import (
    PlanStoreError,
    PlanStoreNotFoundError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
)

DENIED = {
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
}
LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict"}
_CODE = re.compile(r"[A-Za-z0-9.]{1,64}")
_GIVEN_CREDENTIALS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def _code(exc: ClientError) -> tuple[str, int]:
    """(error code, HTTP status) of a botocore ``ClientError``. A code that is not 1 to 64
    letters, digits and dots (as every S3 code is) is left out: ``""``."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return (code if _CODE.fullmatch(code) else ""), status


def _lost_race(exc: ClientError) -> bool:
    code, status = _code(exc)
    return code in LOST_RACE or status in (409, 412)


def _missing_key(exc: ClientError) -> bool:
    code, status = _code(exc)
    return code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket")


_TLS: dict[tuple[str, ...], Any] = {}
"""The TLS contexts of this process's HTTP sessions, one per set of TLS settings."""
_TLS_LOCK = threading.Lock()


class CappedSession(AIOHTTPSession):  # type: ignore[misc]
    """aiobotocore's HTTP session, reading at most ``ERROR_BODY_LIMIT`` bytes of an error
    response and ``BODY_LIMIT`` of another buffered one (botocore would read either whole,
    however long). A longer error body is cut (botocore then reports the HTTP status); a
    longer other body raises ``ResponseTooLargeError``. Streamed bodies (a ``GetObject``
    that succeeds) are left to the caller, who reads at most ``READ_LIMIT``.

    Its TLS contexts are built once per process for each set of TLS settings (verify, CA
    bundle, client certificate, proxy) and shared by every session: aiobotocore builds them
    for each new client, loading the CA bundle (about 20 ms of CPU) even for an ``http://``
    endpoint. A CA bundle changed on disk is read again by a new process."""

    def _build_ssl_contexts(self, proxy_url: str | None) -> Any:
        settings = sorted(self._proxy_config.settings.items())
        key = tuple(map(repr, (self._verify, self._cert_file, self._key_file, proxy_url, settings)))
        with _TLS_LOCK:
            built = _TLS.get(key)
        if built is None:
            built = super()._build_ssl_contexts(proxy_url)
            with _TLS_LOCK:
                built = _TLS.setdefault(key, built)
        return built

    async def send(self, request: Any) -> Any:
        streamed = request.stream_output
        request.stream_output = True  # keep the body unread: it is read below, capped
        try:
            response = await super().send(request)
        finally:
            request.stream_output = streamed
        error = response.status_code >= 300
        if streamed and not error:
            return response
        limit = ERROR_BODY_LIMIT if error else BODY_LIMIT
        raw = response.raw
        try:
            body = await read_bounded(raw.content.read, limit + 1)
        except BaseException:
            raw.close()
            raise
        if len(body) > limit:
            raw.close()  # drops the connection: the rest is never read
            if not error:
                raise ResponseTooLargeError(limit)
            body = body[:limit]
        else:
            raw.release()
        response._content = body
        return response


_SESSION_OPTIONS = frozenset(inspect.signature(AioSession.__init__).parameters) - {"self"}
_loader_lock = threading.Lock()
_loader: Any = None


def _session(options: dict[str, Any]) -> AioSession:
    """A botocore session for one store's clients (taking its options out of ``options``),
    whose data loader, botocore's parsed service model and endpoint data, every store of the
    process shares: parsing them again cost about 100 ms of CPU per client on the boot path."""
    global _loader
    session = AioSession(**{k: options.pop(k) for k in list(options) if k in _SESSION_OPTIONS})
    with _loader_lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session


class S3Store(RemoteStore):
    """``s3://bucket/prefix``: atomic create and compare-and-swap by conditional ``PutObject``."""

    accepted_options = client_option_names(s3fs.S3FileSystem.__init__, AioSession.__init__)

    def __init__(self, url: str, **storage_options: Any) -> None:
        super().__init__(url, storage_options)
        options = dict(self.client_options)
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("connect_timeout", self.timeouts.connect)
        config.setdefault("read_timeout", self.timeouts.read)
        config.setdefault(
            "retries", {"total_max_attempts": self.timeouts.retries + 1, "mode": "standard"}
        )
        config["http_session_cls"] = CappedSession
        if options.get("session") is None:  # one session for both clients
            options["session"] = _session(options)
        self.fs = s3fs.S3FileSystem(config_kwargs=config, skip_instance_cache=True, **options)
        # streams (a part's upload, completing a large upload, a body read chunk by chunk)
        # wait longer per attempt than the read timeout sized for plans allows
        bulk = {**config, "read_timeout": max(self.timeouts.read, UPLOAD_CALL_S)}
        self._bulk = s3fs.S3FileSystem(config_kwargs=bulk, skip_instance_cache=True, **options)
        self._opened: set[Any] = set()

    async def _client(self, *, bulk: bool = False) -> Any:
        """The client (``bulk``: the one for streams); the credentials botocore's chain
        resolved for it are masked in every message from now on (``resolved``)."""
        fs = self._bulk if bulk else self.fs
        self._opened.add(fs)
        client = await fs.set_session()
        if not self._credentials_given:
            credentials = await fs.session.get_credentials()  # the client's, cached
            if credentials is not None:
                frozen = await credentials.get_frozen_credentials()
                self.resolved(frozen.access_key, frozen.secret_key, frozen.token)
        return client

    @property
    def _credentials_given(self) -> bool:
        """True if the storage options name the credentials (masked as such), or there are
        none (``anon``); else botocore's chain resolves them (environment, files, roles)."""
        fs = self.fs
        given = any(k in (fs.client_kwargs or {}) for k in _GIVEN_CREDENTIALS)
        return bool(fs.anon or fs.key or fs.secret or fs.token or given)

    def credential_source(self) -> str:
        fs = self.fs
        if fs.anon:
            return "anonymous"
        if fs.key:
            return "storage options (key and secret)"

        async def resolve() -> str:
            await fs.set_session()
            creds = await fs.session.get_credentials()
            if creds is None:
                return "none found"
            return f"botocore: {getattr(creds, 'method', None) or 'unknown'}"

        return self._run("credentials", resolve)

    def endpoint(self) -> str:
        async def resolve() -> str:
            return str((await self._client()).meta.endpoint_url)

        return self._run("open", resolve)

    # -- the object layer -----------------------------------------------------------------
    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        """One ``GetObject``: at most ``limit`` bytes of the body, and the ETag."""

        async def get() -> tuple[bytes, object] | None:
            resp = await self._get(name)
            if resp is None:
                return None
            body = resp["Body"]
            try:
                data = await read_bounded(body.read, limit)
            finally:
                body.close()
            return data, resp["ETag"]

        return self._run("read", get)

    def open_object(self, name: str) -> Opened | None:
        resp = self._run("read", functools.partial(self._get, name, bulk=True))
        if resp is None:
            return None
        body = resp["Body"]
        return Opened(StreamReader(self, body.read, body.close), resp["ETag"])

    async def _get(self, name: str, *, bulk: bool = False) -> Any:
        """``GetObject``'s answer (its body unread), or None if there is no such object."""
        s3 = await self._client(bulk=bulk)
        try:
            resp = await s3.get_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as exc:
            if _missing_key(exc):
                return None
            raise
        if "ETag" not in resp:
            resp["Body"].close()
            raise PlanStoreError(f"{self.url}: read: the response carries no ETag")
        return resp

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        """Under one part (``PART_BYTES``): a ``PutObject`` with ``If-None-Match: *`` (create)
        or ``If-Match`` (update). One part or more: a multipart upload completed under the
        same condition, aborted on any failure, or when the condition fails."""
        key = self._key(name)
        condition = (
            {"IfMatch": str(mode.version)} if isinstance(mode, Update) else {"IfNoneMatch": "*"}
        )
        stream = parts(chunks)
        first = next(stream)
        second = next(stream, None)
        if second is None:
            return self._conditional(
                "put_object", condition, Key=key, Body=first, **self._put_args(name)
            )
        upload_id = self._run("write", functools.partial(self._start_upload, key, name))
        done: list[dict[str, Any]] = []
        try:
            for number, data in enumerate(itertools.chain((first, second), stream), 1):
                if data or number <= 2:
                    self._upload_part(key, upload_id, number, data, done)
            written = self._conditional(
                "complete_multipart_upload",
                condition,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": done},
            )
        except BaseException:
            self._abort(key, upload_id)
            raise
        if not written:
            self._abort(key, upload_id)
        return written

    def _put_args(self, name: str) -> dict[str, Any]:
        kind = CONTENT_TYPE if name.endswith(".json") else "application/octet-stream"
        return {"ContentType": kind, **self.fs.s3_additional_kwargs}

    async def _start_upload(self, key: str, name: str) -> str:
        s3 = await self._client(bulk=True)
        resp = await s3.create_multipart_upload(Bucket=self.bucket, Key=key, **self._put_args(name))
        return str(resp["UploadId"])

    def _upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, done: list[dict[str, Any]]
    ) -> None:
        async def part() -> None:
            s3 = await self._client(bulk=True)
            resp = await s3.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            )
            done.append({"PartNumber": number, "ETag": resp["ETag"]})

        self._run("write", part, UPLOAD_CALL_S)

    def _conditional(self, call: str, condition: dict[str, str], **kwargs: Any) -> bool:
        """The client's ``call`` under ``condition``; False if it failed (a racing writer
        won, or the object to update is gone)."""

        async def conditional() -> bool:
            s3 = await self._client(bulk=call != "put_object")
            try:
                await getattr(s3, call)(Bucket=self.bucket, **condition, **kwargs)
            except ClientError as exc:
                if _lost_race(exc) or ("IfMatch" in condition and _missing_key(exc)):
                    return False
                raise
            return True

        bound = None if call == "put_object" else UPLOAD_CALL_S
        written: bool = self._run("write", conditional, bound)
        return written

    def _abort(self, key: str, upload_id: str) -> None:
        async def abort() -> None:
            s3 = await self._client(bulk=True)
            await s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

        with contextlib.suppress(Exception):
            self._run("write", abort)

    def delete_object(self, name: str, version: object | None = None) -> bool:
        """With ``version``: ``DeleteObject`` with ``If-Match`` (412 or 404: changed or
        gone). Without: ``HeadObject`` (to tell whether it was there), then ``DeleteObject``."""
        key = self._key(name)

        async def delete() -> bool:
            s3 = await self._client()
            try:
                if version is None:
                    await s3.head_object(Bucket=self.bucket, Key=key)
                    await s3.delete_object(Bucket=self.bucket, Key=key)
                else:
                    await s3.delete_object(Bucket=self.bucket, Key=key, IfMatch=str(version))
            except ClientError as exc:
                if _missing_key(exc) or (version is not None and _lost_race(exc)):
                    return False
                raise
            return True

        return self._run("delete", delete)

    async def _list_page(self, token: str | None, prefix: str) -> tuple[list[str], str | None]:
        s3 = await self._client()
        extra = {"ContinuationToken": token} if token else {}
        resp = await s3.list_objects_v2(
            Bucket=self.bucket,
            Prefix=prefix,
            Delimiter="/",
            MaxKeys=self.list_page_size,
            **extra,
        )
        try:
            keys = [o["Key"] for o in resp.get("Contents", [])]
        except (KeyError, TypeError) as exc:
            raise self.unexpected("list", f"an object without a key ({exc!r:.40})") from exc
        more = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        if not all(isinstance(k, str) for k in keys) or not isinstance(more, (str, type(None))):
            raise self.unexpected("list", "keys and page tokens must be strings")
        return keys, more or None

    def close(self) -> None:
        """Close the clients' connection pools (a later call opens new ones)."""
        opened, self._opened = self._opened, set()
        for fs in opened:

            async def close(fs: Any = fs) -> None:
                await (await fs.set_session()).close()

            self._run("close", close)

    # -- errors --------------------------------------------------------------------------
    def translate(self, exc: Exception, action: str) -> PlanStoreError | None:
        where = f"{self.url}: {action}"
        if isinstance(exc, ClientError):
            code, status = _code(exc)
            what = f"{code or 'error'} (HTTP {status})"
            if code in DENIED or status in (401, 403):
                return PlanStorePermissionError(f"{where}: access denied: {what}", cause=exc)
            if code == "NoSuchBucket":
                return PlanStoreNotFoundError(
                    f"{where}: bucket {self.bucket!r} does not exist", cause=exc
                )
            if status >= 500 or status in (408, 429) or code in ("SlowDown", "RequestTimeout"):
                return PlanStoreUnavailableError(f"{where}: server error: {what}", cause=exc)
            return PlanStoreError(f"{where}: {what}", cause=exc)
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
            return PlanStorePermissionError(f"{where}: no usable credentials", cause=exc)
        if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, asyncio.TimeoutError)):
            return PlanStoreUnavailableError(
                f"{where}: timed out ({type(exc).__name__})", cause=exc
            )
        if isinstance(exc, (ConnectionError, HTTPClientError, aiohttp.ClientError, OSError)):
            return PlanStoreUnavailableError(
                f"{where}: cannot reach the endpoint ({type(exc).__name__})", cause=exc
            )
        if isinstance(exc, BotoCoreError):
            return PlanStoreError(f"{where}: {type(exc).__name__}", cause=exc)
        return None
