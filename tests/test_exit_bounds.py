"""Time bounds that hold up to the end of the process: a worker whose store call is stuck exits
once its work is done and its record had its bounded wait (``RECORD_EXIT_WAIT_S``: on a
store that is only slow, the record lands), and a ``plancache`` command ends within its own
bound.

The stuck calls are real ones: a TCP server that never answers, and a resolver that never
answers (a mount namespace whose ``/etc/resolv.conf`` names 127.0.0.1, where a UDP socket
takes the queries and drops them; that needs root and ``unshare``, else those tests skip).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plancache import fingerprint, open_store
from plancache._defaults import RECORD_EXIT_WAIT_S
from plancache._keys import plan_object_name
from plancache.testing import FACTORS, GiB, child_env, make_plan
from plancache.testing.hostile import Reply, ScriptedServer, SilentServer
from plancache.testing.servers import CountingProxy, MotoS3, closed_port

Wrap = Callable[[list[str]], list[str]]
BLACK_HOLE = "http://plancache-black-hole.example:9000"
"""An endpoint whose name the silent resolver never answers for."""
TOKEN = "ya29.a0-hardening-raw-access-token"
WORKER = """
import json, sys, time
from plancache import PlanCache
from plancache._config import Settings
from plancache.testing import FACTORS, GiB
settings = Settings(sys.argv[1], storage_options=json.loads(sys.argv[2]), local_tier=None)
cache = PlanCache(settings.open_store, timeout=1.0)
cache.warm()  # as the plugin does when the worker module loads: the probe starts
looked = cache.lookup(FACTORS, current_free_memory=80 * GiB).reason
recorded = cache.record(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=2 * GiB).reason
print(looked, recorded, time.time(), flush=True)
"""


@pytest.fixture
def silent_dns(tmp_path: Path) -> Iterator[Wrap]:
    """A function that wraps a command so that it runs with a resolver that never answers."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /etc/resolv.conf needs root and unshare")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"unshare --mount fails here: {probe.stderr!r}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", 53))
    except OSError as exc:
        sock.close()
        pytest.skip(f"cannot take 127.0.0.1:53 for a silent resolver: {exc}")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\n")
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    try:
        yield lambda cmd: ["unshare", "--mount", "sh", "-c", script, str(resolv), *cmd]
    finally:
        sock.close()


def _worker(url: str, options: dict[str, str], wrap: Wrap = lambda c: c) -> tuple[str, float]:
    """Run ``WORKER`` on the store at ``url``: what it printed (the two reasons) and the
    seconds from the end of its work to its exit."""
    cmd = wrap([sys.executable, "-c", WORKER, url, json.dumps(options)])
    result = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=120)
    exited = time.time()
    assert result.returncode == 0, result.stderr
    *reasons, done = result.stdout.split()
    return " ".join(reasons), exited - float(done)


def _options(scheme: str, endpoint: str) -> dict[str, str]:
    if scheme == "s3":
        return {"endpoint_url": endpoint, "key": "id", "secret": "not-a-secret"}
    return {"endpoint_url": endpoint, "token": "anon"}


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_worker_exits_at_once_when_its_store_never_answers(scheme: str) -> None:
    with SilentServer() as silent:
        reasons, lag = _worker(f"{scheme}://bucket/p", _options(scheme, silent.endpoint))
    assert reasons == "timeout timeout"
    assert lag < RECORD_EXIT_WAIT_S + 1.5, f"exited {lag:.1f} s after its work"


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_worker_exits_at_once_when_dns_never_answers(scheme: str, silent_dns: Wrap) -> None:
    url = f"{scheme}://bucket/p"
    reasons, lag = _worker(url, _options(scheme, BLACK_HOLE), silent_dns)
    assert reasons == "timeout timeout"  # the lookups were stuck, not refused
    assert lag < RECORD_EXIT_WAIT_S + 1.5, f"exited {lag:.1f} s after its work"


def test_a_record_past_its_budget_lands_before_a_short_lived_process_exits(
    moto_s3: MotoS3, s3_bucket: str
) -> None:
    """300 ms per request: the conformance probe (started when the store is warmed) and the
    put outlast the 1 s budget, so ``record`` says ``timeout``; the process's exit waits for
    the write, and the observation is in the store."""
    url = f"s3://{s3_bucket}/slow"
    options = {"endpoint_url": moto_s3.endpoint, "key": "id", "secret": "not-a-secret"}
    with CountingProxy(moto_s3.endpoint, 0.3) as proxy:
        reasons, lag = _worker(url, {**options, "endpoint_url": proxy.endpoint})
    assert reasons.endswith("timeout")
    assert lag < RECORD_EXIT_WAIT_S + 1.5
    stored = open_store(url, **options).get(fingerprint(FACTORS))
    assert stored is not None and stored.max_kv_cache_memory_bytes == GiB


# -- the command -------------------------------------------------------------------------------
def plancache(
    *args: str, wrap: Wrap = lambda c: c, env: dict[str, str] | None = None
) -> tuple[str, float]:
    """Run ``python -m plancache ARGS``, which must fail with exit 2 and one error line: that
    line and the seconds the command took."""
    start = time.monotonic()
    result = subprocess.run(
        wrap([sys.executable, "-m", "plancache", *args]),
        capture_output=True,
        text=True,
        env=child_env() if env is None else env,
        timeout=120,
    )
    seconds = time.monotonic() - start
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("plancache: error: ") and result.stderr.count("\n") == 1
    return result.stderr, seconds


SLACK_S = 2.0
"""What a command may take past its bound beyond the start-up measured in the same run
(``startup``): scheduling on a loaded machine, the imports of a remote backend."""


@pytest.fixture(scope="module")
def startup() -> float:
    """Seconds a command that fails at once takes here, now: the interpreter's start-up, the
    imports and the exit, measured under the same load as the commands it is subtracted from
    (the slowest of three)."""
    return max(plancache("fingerprint", "/nonexistent/factors.json")[1] for _ in range(3))


def test_a_command_ends_on_time_when_dns_never_answers(silent_dns: Wrap, startup: float) -> None:
    options = json.dumps(_options("s3", BLACK_HOLE))
    error, seconds = plancache("ls", "s3://bucket/p", "--storage-options", options, wrap=silent_dns)
    assert "list: no answer within 3 s" in error
    assert seconds - startup < 3.0 + SLACK_S, f"took {seconds:.1f} s, {startup:.1f} s to start"
    args = ("--timeout", "1", "ls", "s3://bucket/p", "--storage-options", options)
    error, seconds = plancache(*args, wrap=silent_dns)
    assert error == "plancache: error: ls: not done within 1 s\n"
    assert seconds - startup < 1.0 + SLACK_S, f"took {seconds:.1f} s, {startup:.1f} s to start"


def _stuck_reads(n: int, release: threading.Event) -> Callable[[str, str, bytes], Reply]:
    """An S3 endpoint that lists ``n`` plans and never answers a read (until ``release``)."""
    keys = "".join(
        f"<Contents><Key>p/{plan_object_name(make_plan(factors={'n': i}).fingerprint)}</Key>"
        "<Size>1</Size></Contents>"
        for i in range(n)
    )
    page = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix>p/</Prefix><IsTruncated>false</IsTruncated>{keys}"
        "</ListBucketResult>"
    ).encode()

    def respond(method: str, path: str, body: bytes) -> Reply:
        if "list-type=2" not in path:
            release.wait(60)
        return 200, {"Content-Type": "application/xml"}, page

    return respond


def test_timeout_bounds_a_whole_command(startup: float) -> None:
    release = threading.Event()
    with ScriptedServer(_stuck_reads(64, release)) as server:
        options = json.dumps(_options("s3", server.endpoint))
        try:  # 64 reads of up to 3 s each, 8 at a time: about 24 s without the bound
            error, seconds = plancache(
                "ls", "s3://b/p", "--timeout", "2", "--storage-options", options
            )
        finally:
            release.set()
    assert error == "plancache: error: ls: not done within 2 s\n"
    assert seconds - startup < 2.0 + SLACK_S, f"took {seconds:.1f} s, {startup:.1f} s to start"


def test_opening_a_remote_store_is_bounded_in_a_command(tmp_path: Path, startup: float) -> None:
    base = {k: v for k, v in child_env().items() if "PROXY" not in k.upper()}
    with SilentServer() as silent:  # gcsfs checks a raw token over HTTPS, here through it
        env = {**base, "HTTPS_PROXY": silent.endpoint}
        options = {"token": TOKEN, "endpoint_url": f"http://127.0.0.1:{closed_port()}"}
        error, seconds = plancache(
            "ls", "gs://bucket/p", "--storage-options", json.dumps(options), env=env
        )
    assert "gs://bucket/p: open: the client did not open within 5 s" in error
    assert seconds - startup < 5.0 + SLACK_S, f"took {seconds:.1f} s, {startup:.1f} s to start"

    # no credentials anywhere: how long discovery takes depends on the machine, the
    # command's does not
    env = {k: v for k, v in base.items() if not k.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_"))}
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    _, seconds = plancache("ls", "gs://bucket/p", env=env)
    assert seconds - startup < 5.0 + SLACK_S, f"took {seconds:.1f} s, {startup:.1f} s to start"
