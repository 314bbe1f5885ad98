"""The main job's console: one line per stage on the terminal; whatever the stages, their
worker processes and the libraries print (log lines, emulator chatter) goes to a log file."""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

T = TypeVar("T")
LOG_FORMAT = "%(asctime)s %(processName)s %(levelname)s %(message)s"


def log_to_stderr() -> None:
    """Log WARNING and above to stderr with time, process and level: in the main job's
    processes (its worker processes included) stderr is the run's log file. The level stays
    WARNING: a handler at INFO would add a log line to every timed lookup."""
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


class Run:
    """Runs the main job's stages. While it is entered, file descriptors 1 and 2 point to
    the log file, so that every print and log line of this process and of every process it
    starts lands there; the terminal gets one line per stage (what, then its seconds, or
    why it was skipped or how it failed). A failed stage is logged with its traceback and
    recorded, and the next stage runs."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.stages: dict[str, dict[str, Any]] = {}
        """Per stage name: what it measures, its status (``measured``, ``skipped: why``,
        ``failed: error``) and its seconds."""
        self._saved: list[int] = []
        self.console: IO[str] = sys.stdout

    def __enter__(self) -> Run:
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        self.console = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
        target = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.dup2(target, 1)
        os.dup2(target, 2)
        os.close(target)
        log_to_stderr()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        self.console.close()

    def stage(self, name: str, what: str, measure: Callable[[], T]) -> T | None:
        """``measure()``, timed; None if it raised (the traceback goes to the log)."""
        self.console.write(f"{what} ... ")
        print(f"=== {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            value = measure()
        except Exception as exc:
            seconds = time.monotonic() - start
            print(f"stage failed: {what}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            self.stages[name] = {"what": what, "status": f"failed: {error}", "seconds": seconds}
            self.console.write(f"FAILED after {_seconds(seconds)} ({error}; see {self.log})\n")
            return None
        seconds = time.monotonic() - start
        self.stages[name] = {"what": what, "status": "measured", "seconds": seconds}
        self.console.write(f"{_seconds(seconds)}\n")
        return value

    def skip(self, name: str, what: str, why: str) -> None:
        """Record (and show) a stage that does not run here, and why."""
        self.stages[name] = {"what": what, "status": f"skipped: {why}", "seconds": 0.0}
        self.console.write(f"{what}: skipped: {why}\n")

    def failed(self) -> dict[str, str]:
        """The stages that raised, with their errors."""
        return {
            name: s["status"].removeprefix("failed: ")
            for name, s in self.stages.items()
            if s["status"].startswith("failed")
        }

    def log_counts(self) -> dict[str, int]:
        """WARNING and ERROR lines in the log (every process's, as ``LOG_FORMAT`` writes them)."""
        counts = {"WARNING": 0, "ERROR": 0}
        with open(self.log, errors="replace") as f:
            for line in f:
                for level in counts:
                    counts[level] += f" {level} " in line
        return counts
