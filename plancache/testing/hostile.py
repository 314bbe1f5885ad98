"""Hostile endpoints for fault-injection tests, on 127.0.0.1 like the servers of
``plancache.testing.servers`` (whose HTTP plumbing they share):

- ``ScriptedServer``: every answer from a function ``respond(method, path, body)``, bodies
  that never end (``endless()``) included;
- ``FixedResponseServer``: one status, headers and body for every request (HTTP 500, 403, ...);
- ``SilentServer``: accepts TCP connections and never answers;
- ``EchoingServer``: answers every request with an S3 or GCS error that echoes the
  credentials the request carried;
- ``LyingProxy``: a proxy that strips the preconditions of conditional writes (S3's
  ``If-None-Match``/``If-Match``, GCS's ``ifGenerationMatch``): a store that ignores them;
- ``FaultyProxy``: a proxy that answers the requests a function picks with one status itself
  (403 on writes: read-only credentials; 503 on some: a flaky store).

Each has ``start``/``stop``, is a context manager and serves from a daemon thread. A port
nothing listens on is ``servers.closed_port()``.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit
from xml.sax.saxutils import escape

from plancache.testing.servers import HOST, Body, CountingProxy, _Handler, _HTTPService, _Server

Reply = tuple[int, Mapping[str, str], Body]
"""A response: ``(status, headers, body)``."""
Respond = Callable[[str, str, bytes], Reply]
"""``respond(method, path, request_body)``: a ``ScriptedServer``'s answer to one request."""


def endless(chunk: bytes = b"x" * 65536) -> Iterator[bytes]:
    """A body that never ends."""
    return itertools.repeat(chunk)


class ScriptedServer(_HTTPService):
    """An HTTP server whose every answer comes from ``respond(method, path, body)``; a body
    that is an iterator of chunks is sent chunked, for as long as it yields and the client
    reads (``endless()`` never ends). Records ``(method, path)`` of each request."""

    def __init__(self, respond: Respond) -> None:
        super().__init__()
        self.respond = respond

    def handle(self, h: _Handler, body: bytes) -> None:
        h.reply(*self.respond(h.command, h.path, body))


class FixedResponseServer(ScriptedServer):
    """Answers every request with one status, headers and body (HTTP 500, 403, ...);
    ``body=None``: an ``endless()`` one."""

    def __init__(
        self, status: int, body: bytes | None = b"", headers: Mapping[str, str] | None = None
    ) -> None:
        def respond(method: str, path: str, request_body: bytes) -> Reply:
            return status, dict(headers or {}), endless() if body is None else body

        super().__init__(respond)


class EchoingServer(_HTTPService):
    """Answers every request with HTTP ``status`` and an error that copies the credentials
    the request carried, as a careless endpoint or proxy would: ``flavour="s3"``, an S3 XML
    error whose ``Code`` is the credential named ``code`` and whose ``Message`` holds them
    all; ``"gcs"``, a JSON error whose ``error.message`` holds them all. ``seen`` holds the
    credentials of every request so far (see ``credentials``)."""

    def __init__(self, flavour: Literal["s3", "gcs"], code: str = "key", status: int = 403) -> None:
        super().__init__()
        self.flavour, self.code, self.status = flavour, code, status
        self.seen: list[dict[str, str]] = []

    @staticmethod
    def credentials(headers: Mapping[str, str]) -> dict[str, str]:
        """What a request's headers (names in lower case) carry: ``key`` (the access key id
        of an AWS signature), ``token`` (``X-Amz-Security-Token``), ``bearer`` or ``basic``
        (the credentials of ``Authorization: Bearer|Basic``)."""
        auth = headers.get("authorization", "")
        found = {"token": headers.get("x-amz-security-token", "")}
        if key := re.search(r"Credential=([^/,\s]+)/", auth):
            found["key"] = key.group(1)
        scheme, _, value = auth.partition(" ")
        found[scheme.lower()] = value
        return {k: v for k, v in found.items() if v and k in ("key", "token", "bearer", "basic")}

    def handle(self, h: _Handler, body: bytes) -> None:
        found = self.credentials({k.lower(): v for k, v in h.headers.items()})
        self.seen.append(found)
        everything = " ".join(f"{k}={v}" for k, v in found.items())
        if self.flavour == "s3":
            code, message = escape(found.get(self.code, "")), escape(everything)
            xml = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
            h.reply(self.status, {"Content-Type": "application/xml"}, xml.encode())
        else:
            error = {"error": {"code": self.status, "message": f"not allowed: {everything}"}}
            h.reply(self.status, {"Content-Type": "application/json"}, json.dumps(error).encode())


class SilentServer(_Server):
    """Accepts TCP connections and never answers (until stopped)."""

    def start(self) -> None:
        self._sock = socket.socket()
        self._sock.bind((HOST, 0))
        self._sock.listen(64)
        self.endpoint = f"http://{HOST}:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self._held.append(conn)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self._sock.close()


PRECONDITION_HEADERS = frozenset({"if-none-match", "if-match"})
PRECONDITION_PARAMS = frozenset({"ifGenerationMatch"})
WRITES = frozenset({"PUT", "POST", "DELETE", "PATCH"})


STREAMED = re.compile(r"(^|&)(uploadId=|uploads(=|&|$)|uploadType=resumable|upload_id=)")
"""The query of a request that belongs to an upload of more than one part."""


class LyingProxy(CountingProxy):
    """Forwards every request without its write preconditions (by default the headers
    ``PRECONDITION_HEADERS`` and query parameters ``PRECONDITION_PARAMS``; ``strip`` names
    those to drop, headers in lower case): in front of an honest store, a store that accepts
    conditional writes unconditionally and overwrites."""

    def __init__(
        self,
        upstream: str,
        strip: Collection[str] = PRECONDITION_HEADERS | PRECONDITION_PARAMS,
        *,
        streams_only: bool = False,
    ) -> None:
        super().__init__(upstream)
        self.strip = frozenset(strip)
        self.streams_only = streams_only
        """Lie only on the requests of uploads of more than one part (S3's multipart uploads,
        GCS's resumable ones): honest for single requests."""

    def outgoing(self, path: str, headers: dict[str, str]) -> str:
        if self.streams_only and not STREAMED.search(urlsplit(path).query):
            return path
        for name in [k for k in headers if k.lower() in self.strip]:
            del headers[name]
        parts = urlsplit(path)
        query = parse_qsl(parts.query, keep_blank_values=True)
        kept = [(k, v) for k, v in query if k not in self.strip]
        if kept == query:
            return path
        return parts.path + (f"?{urlencode(kept)}" if kept else "")


Fails = Callable[[int, str, str], bool]
"""``fails(n, method, path)``: whether a ``FaultyProxy`` answers request number ``n`` (from
0, in order of arrival) itself."""


class FaultyProxy(CountingProxy):
    """Forwards requests like ``CountingProxy``, except those ``fails`` picks, which it
    answers with ``status`` (an S3-style XML error body) without forwarding them."""

    def __init__(self, upstream: str, status: int, fails: Fails) -> None:
        super().__init__(upstream)
        self.status = status
        self.fails = fails
        self._count = itertools.count()

    def handle(self, h: _Handler, body: bytes) -> None:
        if self.fails(next(self._count), h.command, h.path):
            error = b"<Error><Code>Injected</Code><Message>injected fault</Message></Error>"
            h.reply(self.status, {"Content-Type": "application/xml"}, error)
        else:
            super().handle(h, body)


def writes(n: int, method: str, path: str) -> bool:
    """``Fails``: every write (what read-only credentials get: 403)."""
    return method in WRITES


__all__ = [
    "PRECONDITION_HEADERS",
    "PRECONDITION_PARAMS",
    "WRITES",
    "EchoingServer",
    "Fails",
    "FaultyProxy",
    "FixedResponseServer",
    "LyingProxy",
    "Reply",
    "Respond",
    "ScriptedServer",
    "SilentServer",
    "endless",
    "writes",
]
