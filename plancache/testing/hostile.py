"""Hostile endpoints for fault-injection tests, on 127.0.0.1 like the servers of
``plancache.testing.servers`` (whose HTTP plumbing they share):

- ``ScriptedServer``: every answer from a function ``respond(method, path, body)``, bodies
  that never end (``endless()``) included;
- ``FixedResponseServer``: one status, headers and body for every request (HTTP 500, 403, ...);
- ``SilentServer``: accepts TCP connections and never answers.

Each has ``start``/``stop``, is a context manager and serves from a daemon thread. A port
nothing listens on is ``servers.closed_port()``.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable, Iterator, Mapping

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


__all__ = ["FixedResponseServer", "Reply", "Respond", "ScriptedServer", "SilentServer", "endless"]
