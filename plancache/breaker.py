"""The crash-loop breaker: a boot that died after applying a plan is not repeated (local I/O).

Before a worker applies an observation it leaves a *mark* (``arm``): a small JSON file in
``<local directory>/marks/`` naming the fingerprint, the observation, and this process (pid,
process start time, boot id, host), written atomically. Once the KV cache is allocated and
the warm-up ran, the worker removes it (``disarm``). A later boot on the same node that finds
a mark whose process is gone (``recover``) concludes that the boot died with that observation
applied: it renames the mark to a *crash record*, logs a WARNING with ``gate:crashed-before``,
retracts the observation from the store (``PlanCache.retract``; a read-only tiered store
retracts from its local tier only) and never applies it again on this node (``avoided``),
whether or not the retraction reached the store.

A process counts as gone when no process has its pid, when the process under that pid
started at another time (a reused pid), when it is a zombie, or when the host rebooted since
(another boot id). Marks left by other hosts (a shared directory) are never judged. Any crash
in between counts, a preempted node too: that costs one extra profile, where a crash loop
would cost every boot of the fleet.

Bounds: marks and crash records older than ``MAX_AGE_S`` are removed, and past ``MAX_MARKS``
files the oldest go; stale temp files too (``clean``, run by ``recover``; ``plancache prune``
removes them by age).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from plancache.fingerprint import validate_key
from plancache.observation import Observation
from plancache.reasons import Reason

if TYPE_CHECKING:
    from plancache.config import Settings

log = logging.getLogger("plancache")

MARKS_DIR = "marks"
"""The subdirectory of the local directory that holds marks."""
MARK_SUFFIX = ".mark"
CRASHED_SUFFIX = ".crashed"
MAX_MARKS = 64
"""Most files (marks and crash records) kept; past it the oldest are removed."""
MAX_AGE_S = 7 * 86400.0
"""Marks and crash records older than this are removed (the node forgets the crash)."""
MAX_MARK_BYTES = 4096


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of ``pid`` from ``/proc``; None if no
    such process (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return rest[0], int(rest[19])


@dataclass(frozen=True)
class Process:
    """A process, identified so that a reused pid is not mistaken for it."""

    pid: int
    start_time: int | None
    boot_id: str | None
    host: str

    @classmethod
    def current(cls) -> Process:
        pid = os.getpid()
        stat = _stat(pid)
        return cls(pid, None if stat is None else stat[1], _boot_id(), os.uname().nodename)

    def alive(self) -> bool | None:
        """True if this process still runs, False if it is gone, None if this host cannot
        tell (the mark is another host's)."""
        if self.host != os.uname().nodename:
            return None
        boot = _boot_id()
        if self.boot_id is not None and boot is not None and boot != self.boot_id:
            return False
        stat = _stat(self.pid)
        if stat is not None:
            state, start = stat
            return state not in ("Z", "X") and (self.start_time is None or start == self.start_time)
        if os.path.isdir("/proc/self"):
            return False
        try:  # no /proc: the pid alone
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@dataclass(frozen=True)
class Mark:
    """A mark (or crash record) as read from its file."""

    path: Path
    fingerprint: str
    observation: Observation
    process: Process
    marked_at: float

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "fingerprint": self.fingerprint,
                "observation": self.observation.to_dict(),
                "pid": self.process.pid,
                "start_time": self.process.start_time,
                "boot_id": self.process.boot_id,
                "host": self.process.host,
                "marked_at": self.marked_at,
            }
        )

    @classmethod
    def read(cls, path: Path) -> Mark | None:
        """The mark in ``path``; None if it is gone or malformed."""
        try:
            with open(path, "rb") as f:
                obj: Any = orjson.loads(f.read(MAX_MARK_BYTES))
            process = Process(obj["pid"], obj["start_time"], obj["boot_id"], obj["host"])
            if type(process.pid) is not int or type(process.host) is not str:
                return None
            return cls(
                path,
                validate_key(obj["fingerprint"]),
                Observation.from_dict(obj["observation"]),
                process,
                float(obj["marked_at"]),
            )
        except Exception:  # unreadable or malformed: not a mark; ``clean`` removes it by age
            return None


class Retracts(Protocol):
    """What ``recover`` retracts through: ``PlanCache`` (bounded, never raises), or a caller's
    wrapper of it (the vLLM plugin retracts in the background)."""

    def retract(self, fingerprint: str, observation: Observation) -> object: ...


class Breaker:
    """Marks in one directory. ``arm``/``disarm`` around applying a plan; ``recover`` at the
    start of each boot. Never raises: failures are logged and leave the boot as it was."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_marks: int = MAX_MARKS,
        max_age: float = MAX_AGE_S,
    ) -> None:
        self.directory = Path(directory)
        self.max_marks = max_marks
        self.max_age = max_age

    @classmethod
    def for_dir(cls, local_dir: str | os.PathLike[str]) -> Breaker:
        """The breaker whose marks live in ``<local_dir>/marks``."""
        return cls(Path(local_dir) / MARKS_DIR)

    @classmethod
    def from_settings(cls, settings: Settings) -> Breaker:
        """Marks in the local tier, else in the local store, else in the default directory."""
        return cls.for_dir(settings.local_dir)

    def __repr__(self) -> str:
        return f"Breaker({str(self.directory)!r})"

    # -- around applying ---------------------------------------------------------------------
    def arm(self, fingerprint: str, observation: Observation) -> Mark | None:
        """Leave this process's mark for ``observation`` of ``fingerprint``; call it before
        applying. None (logged) when the mark cannot be written. The mark is in place when
        this returns (created under a name no other process uses); its fsync runs in a daemon
        thread, off the boot's critical path, and is done long before the seconds of
        allocation and warm-up that a crash with the plan would need (a process crash needs no
        fsync at all: the file is already in the page cache). A mark cut short by a kill
        during its write is unreadable, ignored, and cleaned up by age."""
        process = Process.current()
        name = f"{fingerprint[:16]}.{process.pid}.{secrets.token_hex(4)}{MARK_SUFFIX}"
        mark = Mark(self.directory / name, fingerprint, observation, process, time.time())
        try:
            validate_key(fingerprint)
            self._create(mark.path, mark.to_json())
        except Exception as exc:
            log.warning("plancache: crash mark not written in %s: %s", self.directory, exc)
            return None
        sync = threading.Thread(target=_sync, args=(mark.path,), name="plancache-mark", daemon=True)
        sync.start()
        return mark

    def disarm(self, mark: Mark | None) -> None:
        """Remove ``mark``: the plan fitted (call it once the warm-up returned)."""
        if mark is None:
            return
        try:
            mark.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("plancache: crash mark %s not removed: %s", mark.path, exc)

    # -- at the next boot ------------------------------------------------------------------
    def recover(self, cache: Retracts, fingerprint: str) -> frozenset[str]:
        """Turn the marks of ``fingerprint`` left by processes that are gone into crash
        records, log each with ``gate:crashed-before`` and retract its observation through
        ``cache`` (``PlanCache.retract`` is bounded by its budget); then clean up (``clean``).
        Returns
        ``avoided(fingerprint)``: pass it to ``PlanCache.lookup(..., avoid=...)``."""
        for mark in self._marks(MARK_SUFFIX):
            if mark.fingerprint != fingerprint or mark.process.alive() is not False:
                continue
            crashed = mark.path.with_suffix(CRASHED_SUFFIX)
            try:
                os.replace(mark.path, crashed)  # one boot wins a mark; the others skip it
            except OSError:
                continue
            o = mark.observation
            log.warning(
                "plancache: %s fp=%s kv=%d baseline=%d: process %d on %s died after applying "
                "it; retracting it and profiling instead",
                Reason.CRASHED_BEFORE.value,
                fingerprint[:12],
                o.kv_cache_memory_bytes,
                o.free_memory_baseline,
                mark.process.pid,
                mark.process.host,
            )
            try:
                cache.retract(fingerprint, o)
            except Exception as exc:  # PlanCache never raises; a caller's wrapper might
                log.warning("plancache: retract fp=%s failed: %s", fingerprint[:12], exc)
        self.clean()
        return self.avoided(fingerprint)

    def avoided(self, fingerprint: str) -> frozenset[str]:
        """Digests of the observations of ``fingerprint`` a boot on this node crashed with."""
        return frozenset(
            m.observation.digest
            for m in self._marks(CRASHED_SUFFIX)
            if m.fingerprint == fingerprint
        )

    def clean(self, older_than: float | None = None, *, dry_run: bool = False) -> int:
        """Remove marks and crash records older than ``older_than`` (default ``max_age``)
        and past ``max_marks`` the oldest; returns how many were (or, with ``dry_run``, would
        be) removed. Never raises."""
        limit = self.max_age if older_than is None else older_than
        now = time.time()
        removed = 0
        try:
            files = []
            for path in self._files():
                with contextlib.suppress(FileNotFoundError):
                    files.append((path.stat().st_mtime, path))
            files.sort(reverse=True)
            kept = 0
            for mtime, path in files:
                if now - mtime > limit or kept >= self.max_marks:
                    if not dry_run:
                        path.unlink(missing_ok=True)
                    removed += 1
                else:
                    kept += 1
        except OSError as exc:
            log.warning("plancache: crash marks in %s not cleaned: %s", self.directory, exc)
        return removed

    # -- files -------------------------------------------------------------------------------
    def _files(self) -> Iterator[Path]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return iter(())
        suffixes = (MARK_SUFFIX, CRASHED_SUFFIX)
        return (self.directory / n for n in names if n.endswith(suffixes))

    def _marks(self, suffix: str) -> list[Mark]:
        try:
            paths = [p for p in self._files() if p.name.endswith(suffix)]
        except OSError as exc:
            log.warning("plancache: crash marks in %s not read: %s", self.directory, exc)
            return []
        return [m for m in map(Mark.read, sorted(paths)) if m is not None]

    def _create(self, path: Path, data: bytes) -> None:
        """Create ``path`` (a name no other process uses) holding ``data``; never follows or
        replaces an existing entry."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _sync(path: Path) -> None:
    """fsync the file at ``path`` and its directory; a failure is logged (the mark is in
    place either way)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        log.debug("plancache: crash mark %s not synced: %s", path.name, exc)
