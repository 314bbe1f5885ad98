"""plancache._background: jobs on reused daemon threads, never queued behind one another."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from plancache import _background as background
from plancache._background import IDLE_NAME, MAX_IDLE, JobTimeout


def test_a_job_gives_its_result_or_its_exception() -> None:
    assert background.start(lambda: 42).wait(5) == 42

    def fail() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        background.start(fail).wait(5)


def test_a_wait_is_bounded() -> None:
    release = threading.Event()
    job = background.start(lambda: release.wait(5))
    with pytest.raises(JobTimeout):
        job.wait(0.1)
    assert not job.join(0.0) and not job.done()  # the wait ended before the job: its bound
    release.set()
    assert job.wait(5) is True


def test_an_idle_thread_is_reused_and_named_for_its_job() -> None:
    first = background.start(threading.current_thread, "plancache-first").wait(5)
    assert first.daemon
    for _ in range(100):  # it offers itself as idle just after its job returned
        if first.name == IDLE_NAME:
            break
        time.sleep(0.01)
    names = background.start(lambda: threading.current_thread().name, "plancache-second")
    assert names.wait(5) == "plancache-second"
    assert background.start(threading.current_thread).wait(5) is first


def test_a_job_that_hangs_holds_up_no_other() -> None:
    release = threading.Event()
    hung = background.start(lambda: (threading.current_thread(), release.wait(30))[0])
    try:
        later = background.start(threading.current_thread)
        assert later.join(5)  # not behind the hung job
        assert not hung.done()
    finally:
        release.set()
    assert hung.wait(5) is not later.wait(0)


def test_idle_threads_are_bounded() -> None:
    release = threading.Event()
    jobs = [background.start(lambda: release.wait(30)) for _ in range(MAX_IDLE + 4)]
    release.set()
    assert all(job.join(5) for job in jobs)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the surplus threads end once their job returned
        idle = [t for t in threading.enumerate() if t.name == IDLE_NAME]
        if len(idle) <= MAX_IDLE:
            break
        time.sleep(0.01)
    assert len(idle) <= MAX_IDLE


CHILD = """
import os, threading
from plancache import _background as background

parent = background.start(threading.current_thread).wait(5)  # then idle, in the parent
pid = os.fork()
if pid == 0:  # the parent's idle thread is not here: a job must still run
    job = background.start(threading.current_thread)
    os._exit(0 if job.join(5) and job.wait(0) is not parent else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_jobs_on_its_own_threads() -> None:
    """A child forked while the parent held an idle thread (vLLM forks its workers)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "0", out.stderr
