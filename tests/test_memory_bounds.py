"""Memory stays bounded whatever an endpoint sends: endless error and write response bodies.

Each case runs in a child process (the endpoints stay in this one) and reports the growth of
the child's peak resident memory (``VmHWM``) over a lookup or a record against an endpoint
that answers with an endless chunked body, after the abandoned call's own bound has passed.
A first call against an endpoint with a small body of the same status loads every module and
session first, so the growth is the cost of the hostile body alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plancache.testing.hostile import FixedResponseServer

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
CHILD = r"""
import json, sys, threading, time
from plancache import PlanCache, open_store
from plancache._background import IDLE_NAME
from plancache.testing import FACTORS, GiB

backend, action, status, warm_endpoint, endpoint = sys.argv[1:]

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

def store(url):  # each call abandoned at its own 1.5 s bound
    if backend == "s3":
        return open_store("s3://hostile/p", endpoint_url=url, timeout=1.5)
    return open_store("gs://hostile/p", endpoint_url=url, token="anon", timeout=1.5)

def call(cache):
    start = time.monotonic()
    if action == "lookup":
        reason = cache.lookup(FACTORS, current_free_memory=80 * GiB).reason
    else:
        reason = cache.record(
            FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB
        ).reason
    return str(reason), time.monotonic() - start

def settled():  # until every job thread is idle again (the abandoned call ended), bounded
    end = time.monotonic() + 30
    while time.monotonic() < end and any(
        t.name.startswith("plancache") and t.name != IDLE_NAME for t in threading.enumerate()
    ):
        time.sleep(0.05)

call(PlanCache(store(warm_endpoint), timeout=10.0))  # returns when all is loaded
settled()
before = hwm()
reason, seconds = call(PlanCache(store(endpoint), timeout=1.0))
settled()  # the abandoned call ran to its own 1.5 s bound
print(json.dumps({"growth": hwm() - before, "reason": reason, "seconds": seconds}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("action", ["lookup", "record"])
@pytest.mark.parametrize("backend", ["s3", "gcs"])
@pytest.mark.parametrize("status", [500, 200])
def test_peak_memory_growth_is_bounded_on_endless_bodies(
    backend: str, action: str, status: int
) -> None:
    small = b"<Error><Code>InternalError</Code></Error>" if backend == "s3" else b"{}"
    with FixedResponseServer(status, small) as warm, FixedResponseServer(status, None) as bad:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                backend,
                action,
                str(status),
                warm.endpoint,
                bad.endpoint,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=ROOT,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["seconds"] < 10 * 1.0, result  # the 1 s budget: the endless body never ends
    assert result["reason"] != "hit", result
    assert result["growth"] <= 50 * MiB, f"peak memory grew by {result['growth'] / MiB:.0f} MiB"
