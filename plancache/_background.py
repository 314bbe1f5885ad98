"""Work off the caller's thread, on daemon threads kept for reuse (stdlib only).

``start(fn, name)`` hands ``fn`` to an idle thread of this process, or to a new one where
none is idle, and returns a ``Job`` at once; ``Job.join`` and ``Job.wait`` wait for it,
bounded by the caller; ``within(fn, timeout)`` is a call so bounded, told to stop past it.

Guarantees: a job starts at once and never waits for another (a thread is handed work only
while idle, so one held by a call that hangs delays nobody); every thread is a daemon, so no
job delays the process's exit; at most ``MAX_IDLE`` threads wait idle, the others end when
their job returns; a forked child starts with none (the parent's threads are not in it).

Why: ``Thread.start`` waits until the new thread runs (0.1 to 1 ms on a loaded machine),
where handing a job to an idle thread takes a lock and a wake-up. A boot whose store was
opened in the background (``PlanCache.warm``) starts its fetch, and its crash mark's fsync,
on that thread, off the critical path's clock.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from plancache.errors import JobTimeout as JobTimeout  # raised by Job.wait

T = TypeVar("T")
MAX_IDLE = 4
"""Most threads kept waiting for work."""
IDLE_NAME = "plancache-idle"
"""The name of a thread while it waits for work (a thread takes its job's name)."""


class Job(Generic[T]):
    """``fn()`` running on a daemon thread (``start``); its result, or the ``Exception`` it
    raised, once done. A ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``) is not handed over: it ends the thread, and the job is done with
    the result None."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self.name = name
        self._fn = fn
        self._done = threading.Event()
        self._value: T | None = None
        self._error: Exception | None = None

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except Exception as exc:  # handed to whoever waits
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds; True once the job is done."""
        return self._done.wait(max(0.0, timeout))

    def wait(self, timeout: float) -> T:
        """``fn``'s result or exception, or ``JobTimeout`` past ``timeout`` seconds."""
        if not self.join(timeout):
            raise JobTimeout
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when fn returned


class _Worker:
    """A daemon thread that runs the jobs handed to it, one at a time, and offers itself as
    idle between them (or ends, where ``MAX_IDLE`` threads are idle already)."""

    def __init__(self, job: Job[Any]) -> None:
        self._jobs: queue.SimpleQueue[Job[Any]] = queue.SimpleQueue()
        self._jobs.put(job)
        threading.Thread(target=self._serve, name=job.name, daemon=True).start()

    def hand(self, job: Job[Any]) -> None:
        self._jobs.put(job)

    def _serve(self) -> None:
        thread = threading.current_thread()
        while True:
            job = self._jobs.get()
            thread.name = job.name
            job._run()
            thread.name = IDLE_NAME
            with _lock:
                if len(_idle) >= MAX_IDLE:
                    return
                _idle.append(self)


_lock = threading.Lock()
_idle: list[_Worker] = []
"""Threads waiting for work, the most recently idle last."""


def start(fn: Callable[[], T], name: str = "plancache-io") -> Job[T]:
    """Run ``fn`` on an idle daemon thread, or on a new one if none is idle (named ``name``
    while it runs); returns at once."""
    job = Job(fn, name)
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        _Worker(job)
    else:
        worker.hand(job)
    return job


def within(fn: Callable[[threading.Event], T], timeout: float, name: str = "plancache-io") -> T:
    """``fn(stop)`` on a daemon thread (``start``), waited for at most ``timeout`` seconds
    however long the calls it makes stall (a registered third party's backend included):
    its result, or what it raised; past the bound, ``stop`` is set (``fn`` does nothing
    more once it is) and ``JobTimeout`` is raised."""
    stop = threading.Event()
    job = start(lambda: fn(stop), name)
    try:
        return job.wait(timeout)
    except JobTimeout:
        stop.set()
        raise


def _forget_parents_threads() -> None:
    """In a forked child: the parent's idle threads do not exist here (and the parent may
    have held the lock when it forked)."""
    global _lock, _idle
    _lock = threading.Lock()
    _idle = []


os.register_at_fork(after_in_child=_forget_parents_threads)
