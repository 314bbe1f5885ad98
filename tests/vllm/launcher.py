"""Boots of the real vLLM Worker without paying the import of vLLM and torch each time.

``Launcher`` starts this file as a process (the zygote) that imports torch and vLLM once,
then forks one fresh child per boot. The zygote never starts a thread (``OMP_NUM_THREADS=1``
keeps OpenBLAS from starting its pool at import) and checks ``/proc/self/task`` before every
fork: a fork of a threaded process could inherit a lock another thread held. It does not
import plancache or ``vllm.v1.worker.gpu_worker``: each child applies its own environment
and working directory, then runs its script as ``__main__``, so the plugin registers and
patches the worker module in the child exactly as in a process of its own. Each child is a
real process of its own: its pid is known, SIGKILL ends it, its exit status is reported as
``subprocess.Popen.returncode`` reports it.

usage: launcher.py SOCKET (serves until its parent is gone)
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

PREIMPORT = (
    "torch",
    "vllm",
    "vllm.engine.arg_utils",
    "vllm.distributed.parallel_state",
    "vllm.v1.worker.gpu_model_runner",  # the bulk of gpu_worker's imports, not gpu_worker
)
"""What the zygote imports once: the cost of every boot's start, not the module the plugin
patches on import."""
ARCHITECTURES = ("LlamaForCausalLM",)
"""Model classes the zygote inspects once (vLLM does it in a subprocess that imports vLLM
again, once per cache root): its children find the answer in memory."""
ZYGOTE_ENV = {"OMP_NUM_THREADS": "1"}
"""Settings the zygote (and so every child) starts with: no thread pool at import."""
START_TIMEOUT_S = 300.0


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(path: str) -> tuple[dict[str, Any], list[int]]:
    """Import ``PREIMPORT``, then accept boot requests on the Unix socket at ``path`` until
    the parent is gone. Returns only in a forked child: its request and its stdio fds."""
    parent = os.getppid()
    for name in PREIMPORT:
        __import__(name)
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in ARCHITECTURES:
        assert ModelRegistry._try_inspect_model_cls(arch) is not None, arch
    assert "vllm.v1.worker.gpu_worker" not in sys.modules
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection its status goes to
    while os.getppid() == parent:
        with contextlib.suppress(ChildProcessError):
            while waiting:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = waiting.pop(pid)
                with contextlib.suppress(OSError):
                    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                conn.close()
        if not _readable(listener):
            continue
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while not message.endswith(b"\n") and (rest := conn.recv(1 << 16)):
            message += rest  # a long request
        if _threads() != 1:
            conn.sendall(b"error: the launcher holds %d threads\n" % _threads())
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            for other in waiting.values():
                other.close()
            return json.loads(message), fds
        for fd in fds:
            os.close(fd)
        conn.sendall(b"%d\n" % pid)
        waiting[pid] = conn
    raise SystemExit(0)


def _readable(listener: socket.socket) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        return bool(sel.select(0.05))


def _line(conn: socket.socket) -> str:
    """One line from ``conn``, read byte by byte: nothing after it is consumed."""
    data = b""
    while not data.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            raise RuntimeError("the launcher closed the connection")
        data += byte
    return data.decode()


def become(request: Mapping[str, Any], fds: Sequence[int]) -> None:
    """In the forked child: take the request's stdio, environment, directory and argv, then
    run its script as ``__main__`` (as ``python SCRIPT ARGS`` would)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv: list[str] = request["argv"]
    paths = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[0] = str(Path(argv[0]).resolve().parent)
    sys.path[1:1] = [p for p in paths if p not in sys.path]
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


class Boot:
    """One forked child: the part of ``subprocess.Popen`` the tests use (text mode)."""

    def __init__(self, conn: socket.socket, pid: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        self._pipes = {stdout: bytearray(), stderr: bytearray()}
        self._open = [stdout, stderr]
        self._order = (stdout, stderr)

    def poll(self) -> int | None:
        """The exit status if the child has ended, else None."""
        if self.returncode is None:
            self._conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status (``subprocess.TimeoutExpired`` after ``timeout``)."""
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                self._read_status()
            except TimeoutError:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0) from None
        assert self.returncode is not None
        return self.returncode

    def _read_status(self) -> None:
        self.returncode = int(_line(self._conn))
        self._conn.close()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read stdout and stderr to their end, then wait for the exit status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for fd in self._open:
                sel.register(fd, selectors.EVENT_READ)
            while self._open:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
                for key, _ in sel.select(left):
                    fd = int(key.fd)
                    chunk = os.read(fd, 1 << 16)
                    self._pipes[fd] += chunk
                    if not chunk:
                        sel.unregister(fd)
                        os.close(fd)
                        self._open.remove(fd)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        out, err = (bytes(self._pipes[fd]).decode(errors="replace") for fd in self._order)
        return out, err

    def kill(self) -> None:
        """SIGKILL the child unless it has ended."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class Launcher:
    """The zygote process, started with ``env`` (plus ``ZYGOTE_ENV``); forks ``Boot``s."""

    def __init__(self, directory: Path, env: Mapping[str, str]) -> None:
        self._path = str(directory / "launcher.sock")
        self._log = directory / "launcher.log"
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, __file__, self._path],
                env={**env, **ZYGOTE_ENV},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(self._path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the launcher did not start: {self._log.read_text()[-4000:]}")
            time.sleep(0.1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> Boot:
        """Fork a child that runs ``python ARGV`` with exactly ``env``, in ``cwd``."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._path)
            request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd)}
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [null, out_w, err_w])
            reply = _line(conn)
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        if not reply.strip().isdigit():
            os.close(out_r)
            os.close(err_r)
            conn.close()
            raise RuntimeError(f"the launcher refused the boot: {reply!r}")
        return Boot(conn, int(reply), out_r, err_r)

    def close(self) -> None:
        """Stop the zygote (its children run on to their end)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


if __name__ == "__main__":
    request, fds = serve(sys.argv[1])
    become(request, fds)
