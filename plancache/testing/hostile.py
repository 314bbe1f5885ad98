"""Hostile endpoints for fault-injection tests, on 127.0.0.1 like the servers of
``plancache.testing.servers`` (whose HTTP plumbing they share):

- ``ScriptedServer``: every answer from a function ``respond(method, path, body)``, bodies
  that never end (``endless()``) included;
- ``FixedResponseServer``: one status, headers and body for every request (HTTP 500, 403, ...);
- ``SilentServer``: accepts TCP connections and never answers;
- ``EchoingServer``: answers every request with an S3 or GCS error that echoes the
  credentials the request carried.

Each has ``start``/``stop``, is a context manager and serves from a daemon thread. A port
nothing listens on is ``servers.closed_port()``.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Literal
from xml.sax.saxutils import escape

from plancache.testing.servers import HOST, Body, _Handler, _HTTPService, _Server

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


__all__ = [
    "EchoingServer",
    "FixedResponseServer",
    "Reply",
    "Respond",
    "ScriptedServer",
    "SilentServer",
    "endless",
]
