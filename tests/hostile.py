"""Hostile HTTP endpoints on 127.0.0.1 for the hardening tests.

``ScriptedServer`` answers each request with what its ``respond`` function returns: a status,
headers and a body that is either bytes or an iterator of chunks (sent chunked, for as long
as the iterator yields and the client reads: ``endless()`` never ends).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

HOST = "127.0.0.1"
Body = bytes | Iterable[bytes]
Reply = tuple[int, Mapping[str, str], Body]
Respond = Callable[[str, str, bytes], Reply]


def endless(chunk: bytes = b"x" * 65536) -> Iterator[bytes]:
    """A body that never ends."""
    return itertools.repeat(chunk)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._body()
        owner = self.server.owner
        with owner.lock:
            owner.requests.append((self.command, self.path))
        status, headers, payload = owner.respond(self.command, self.path, body)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if isinstance(payload, bytes):
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in payload:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client hung up: what a capped reader does
            pass

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: ScriptedServer


class ScriptedServer:
    """An HTTP server whose every answer comes from ``respond(method, path, body)``."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []

    def __enter__(self) -> ScriptedServer:
        self._httpd = _Server((HOST, 0), _Handler)
        self._httpd.owner = self
        self.endpoint = f"http://{HOST}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def fixed(status: int, body: bytes | None, headers: Mapping[str, str] | None = None) -> Respond:
    """A ``respond`` that gives every request the same answer; ``body=None``: ``endless()``."""

    def respond(method: str, path: str, request_body: bytes) -> Reply:
        return status, dict(headers or {}), endless() if body is None else body

    return respond
