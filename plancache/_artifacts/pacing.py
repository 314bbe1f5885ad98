"""A fetch's pace against compile time: never slower than compiling, never past its bound.

Guarantees: a stream read through ``_Deadline`` raises ``TimedOut`` once its deadline has
passed or its caller stopped waiting; one watched by ``_Pace`` raises ``TooSlow`` as soon as
the time spent plus the rest at the rate seen cannot beat the producer's recorded compile
time (after ``MIN_PACE_S`` of streaming); ``join_fetch`` waits for a fetch at a boot's first
forward only while it can still pay off, and cancels it otherwise (it then installs nothing).
Both exceptions are ``ArtifactError``s, told apart by type.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from plancache._artifacts.manifest import Manifest, Readable
from plancache._background import Job
from plancache._defaults import FIRST_ANSWER_S, JOIN_S, MIN_PACE_S, POLL_S
from plancache.errors import ArtifactError

R = TypeVar("R")


class TimedOut(ArtifactError):
    """A fetch passed its deadline, or its caller stopped waiting for it."""


class TooSlow(ArtifactError):
    """A fetch's stream could not beat compiling at the rate seen."""


class _Deadline:
    """A reader that raises ``TimedOut`` once ``deadline`` (monotonic) has passed or
    ``cancelled()`` says the caller stopped waiting."""

    def __init__(
        self, inner: Readable, deadline: float, cancelled: Callable[[], bool] = lambda: False
    ) -> None:
        self.inner, self.deadline, self.cancelled = inner, deadline, cancelled

    def read(self, n: int, /) -> bytes:
        if time.monotonic() > self.deadline:
            raise TimedOut("fetch timed out")
        if self.cancelled():
            raise TimedOut("the boot stopped waiting for it")
        return self.inner.read(n)


class _Pace:
    """A fetch's pace against the producer's compile time (``compile_s`` in the manifest's
    producer, where it is recorded): ``update`` raises ``TooSlow`` once the time spent so
    far plus the rest at the rate seen cannot beat compiling."""

    def __init__(self, start: float) -> None:
        self.start, self.total, self.done = start, 0, 0
        self.budget: float | None = None

    def watching(self, judge: Callable[[Manifest], R]) -> Callable[[Manifest], R]:
        """``judge``, taking the manifest's size and compile time first."""

        def accept(manifest: Manifest) -> R:
            cost = manifest.producer.get("compile_s")
            self.total, self.budget = manifest.total_size, None
            if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost > 0:
                self.budget = float(cost)
            return judge(manifest)

        return accept

    def update(self, n: int) -> None:
        self.done += n
        elapsed = time.monotonic() - self.start
        if self.budget is None or elapsed < MIN_PACE_S:
            return
        projected = elapsed * self.total / self.done
        if projected > self.budget:
            raise TooSlow(
                f"slower than compiling: {projected:.1f} s at the rate seen, against "
                f"{self.budget:.1f} s the producer took to compile"
            )


def join_fetch(
    job: Job[Any],
    deadline: float,
    streaming: threading.Event,
    cancelled: threading.Event,
    started: float | None = None,
) -> bool:
    """Wait for ``job``, a fetch started at ``started`` (monotonic; default: now) before the
    first forward (``ArtifactStore.fetch`` with ``streaming`` and ``cancelled``): until
    ``deadline`` (monotonic) once it streams, else until ``JOIN_S`` from now or
    ``FIRST_ANSWER_S`` from its start, whichever is later. True if it ended; else
    ``cancelled`` is set (it installs nothing after this) and False."""
    now = time.monotonic()
    give_up = max(now + JOIN_S, (now if started is None else started) + FIRST_ANSWER_S)
    while not job.done():
        limit = deadline if streaming.is_set() else min(deadline, give_up)
        left = limit - time.monotonic()
        if left <= 0:
            cancelled.set()
            return False
        job.join(min(left, POLL_S))
    return True
