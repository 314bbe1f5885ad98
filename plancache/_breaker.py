"""The crash-loop breaker: a boot that died after applying a plan is not repeated (local I/O).

Before a worker applies an observation it leaves a *mark* (``arm``): a small JSON file in
``<local directory>/marks/`` naming the fingerprint, the observation and this boot (pid, boot
id, host), created under a name no other process uses and *locked* (``flock``) before its
content is written; the lock is held for as long as the mark exists. Once the KV cache is
allocated and the warm-up ran, the worker removes the mark and then drops the lock
(``disarm``). The kernel drops a process's locks when it dies, whatever PID namespace or
container it ran in, so a later boot (``recover``) that finds a complete mark whose lock it
can take knows that the boot that wrote it is gone: it renames the mark to a *crash record*,
logs a WARNING with ``gate:crashed-before``, retracts the observation from the store
(``PlanCache.retract``; a read-only tiered store retracts from its local tier only) and never
applies it again on this node (``avoided``), whether or not the retraction reached the store.
Any crash in between counts, a preempted node too: that costs one extra profile, where a
crash loop would cost every boot of the fleet.

A mark is judged only where its lock is evidence: one written on this kernel (the same boot
id: pods that share the directory and the kernel, whatever their host names) or under this
host name (an earlier boot of this host: no lock survives a reboot). A mark of another host
(a directory shared over the network, whose locks need not reach here), a mark on a
filesystem without locks, and a mark without a lock (an older plancache's) are never judged:
neither a crash nor retracted. A child forked (and not exec'd) while the mark is held keeps
the lock until it exits too.

Trust: the directory is created 0700 and each mark 0600. Marks are read only from a
directory, and only files, owned by this user or root that neither the group nor others can
write (a directory of this user's that they could write is made private when a mark is
written in it); anything else is ignored, with one warning per process. Only regular files
are read, never followed or waited on, and at most ``MAX_MARK_BYTES`` of each; a mark cut
short by a kill during its write is unreadable and ignored.

Bounds (``clean``, run by ``recover`` once it decided what to avoid; ``plancache prune``):
marks and crash records dated more than ``MAX_AGE_S`` away from now (past or future) are
removed, and past ``MAX_MARKS`` files the oldest go, except those of the key being booted
(removed by age only). Entries that are not regular files are skipped; one that cannot be
removed does not stop the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from plancache import _background as background
from plancache._defaults import MAX_AGE_S
from plancache._directory import Directory
from plancache._keys import validate_key
from plancache._observation import Observation
from plancache._reasons import Reason

if TYPE_CHECKING:
    from plancache._config import Settings
    from plancache._store import PlanStore

log = logging.getLogger("plancache")

MARKS_DIR = "marks"
"""The subdirectory of the local directory that holds marks."""
MARK_SUFFIX = ".mark"
CRASHED_SUFFIX = ".crashed"
MAX_MARKS = 64
"""Most files (marks and crash records) kept; past it the oldest are removed."""
MAX_MARK_BYTES = 4096
LOCK = "flock"
"""The ``lock`` field of a mark whose writer holds an ``flock`` on it while it exists."""
_held: dict[Path, int] = {}
"""The descriptor holding the lock of each mark this process armed, until disarmed."""
_distrusted = threading.Event()
"""Set once the warning about marks that other users could write was logged."""


@functools.cache
def _boot_id() -> str | None:
    """The kernel's boot id (read once: it holds for the process's life), or None."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _distrust(path: Path, st: os.stat_result) -> None:
    """Log, once per process, that marks were ignored because another user could write them."""
    if _distrusted.is_set():
        return
    _distrusted.set()
    log.warning(
        "plancache: crash marks ignored: %s (owner uid %d, mode %o) can be written by another "
        "user than uid %d or root (this warning is shown once)",
        path,
        st.st_uid,
        stat.S_IMODE(st.st_mode),
        os.geteuid(),
    )


@dataclass(frozen=True)
class Process:
    """The boot that wrote a mark: what tells whether its lock is evidence here."""

    pid: int
    boot_id: str | None
    host: str

    @classmethod
    def current(cls) -> Process:
        return cls(os.getpid(), _boot_id(), os.uname().nodename)

    def gone(self, fd: int) -> bool:
        """True if this process, which locked the mark open at ``fd``, is known to be gone:
        the mark was written on this kernel or under this host name, and its lock can be
        taken now (it stays taken until ``fd`` is closed). False while it holds the lock, and
        where this node cannot tell: another host's mark, a filesystem without locks."""
        same_kernel = self.boot_id is not None and self.boot_id == _boot_id()
        if not same_kernel and self.host != os.uname().nodename:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (EWOULDBLOCK), or no locks here
            return False
        return True


@dataclass(frozen=True)
class Mark:
    """A mark (or crash record) as read from its file."""

    path: Path
    fingerprint: str
    observation: Observation
    process: Process
    marked_at: float
    locked: bool = True
    """Whether its writer locked it (earlier plancache versions did not: never judged)."""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "fingerprint": self.fingerprint,
                "observation": self.observation.to_dict(),
                "pid": self.process.pid,
                "boot_id": self.process.boot_id,
                "host": self.process.host,
                "marked_at": self.marked_at,
                "lock": LOCK if self.locked else None,
            }
        )

    @classmethod
    def parse(cls, path: Path, data: bytes) -> Mark | None:
        """The mark that ``data``, read from ``path``, holds; None if it is malformed."""
        try:
            obj: Any = orjson.loads(data)
            process = Process(obj["pid"], obj["boot_id"], obj["host"])
            if type(process.pid) is not int or type(process.host) is not str:
                return None
            return cls(
                path,
                validate_key(obj["fingerprint"]),
                Observation.from_dict(obj["observation"]),
                process,
                float(obj["marked_at"]),
                obj.get("lock") == LOCK,
            )
        except Exception:  # cut short or malformed: not a mark; ``clean`` removes it by age
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
    def beside(cls, store: PlanStore) -> Breaker | None:
        """The breaker whose marks live beside ``store``'s plans: where its layer is a local
        directory (``ObjectLayer.local_directory``: a node's local directory); None for any
        other store (a node's marks are in its own local directory)."""
        where = store.layer.local_directory()
        return None if where is None else cls.for_dir(where)

    @classmethod
    def from_settings(cls, settings: Settings) -> Breaker:
        """Marks in the local tier, else in the local store, else in the default directory."""
        return cls.for_dir(settings.local_dir)

    def __repr__(self) -> str:
        return f"Breaker({str(self.directory)!r})"

    # -- around applying ---------------------------------------------------------------------
    def arm(self, fingerprint: str, observation: Observation) -> Mark | None:
        """Leave this process's mark for ``observation`` of ``fingerprint``, locked until
        ``disarm``; call it before applying. None (logged) when the mark cannot be written or
        locked. The mark is in place when this returns (created under a name no other process
        uses); its fsync runs in a daemon thread, off the boot's critical path, and is done
        long before the seconds of allocation and warm-up that a crash with the plan would
        need (a process crash needs no fsync at all: the file is already in the page cache)."""
        process = Process.current()
        name = f"{fingerprint[:16]}.{process.pid}.{secrets.token_hex(4)}{MARK_SUFFIX}"
        mark = Mark(self.directory / name, fingerprint, observation, process, time.time())
        try:
            validate_key(fingerprint)
            _held[mark.path] = self._create(name, mark.to_json())
        except Exception as exc:
            log.warning("plancache: crash mark not written in %s: %s", self.directory, exc)
            return None
        return mark

    def disarm(self, mark: Mark | None) -> None:
        """Remove ``mark``, then drop its lock: the plan fitted (call it once the warm-up
        returned). A mark that cannot be removed is emptied (unreadable: never a crash)."""
        if mark is None:
            return
        fd = _held.pop(mark.path, None)
        try:
            with self._opened() as held:
                if held is None:
                    raise OSError("its directory is not usable")
                st = os.fstat(fd) if fd is not None else held.lstat(mark.path.name)
                if st is not None:
                    held.remove(mark.path.name, st)
        except OSError as exc:
            log.warning("plancache: crash mark %s not removed: %s", mark.path, exc)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
        finally:
            if fd is not None:
                os.close(fd)  # only now: an existing mark is always locked

    # -- at the next boot ------------------------------------------------------------------
    def recover(self, cache: Retracts, fingerprint: str) -> frozenset[str]:
        """Turn the marks of ``fingerprint`` whose writers are gone into crash records, log
        each with ``gate:crashed-before`` and retract its observation through ``cache``
        (``PlanCache.retract`` is bounded by its budget); then clean up (``clean``), removing
        the files of ``fingerprint`` by age only (never to make room). Returns
        ``avoided(fingerprint)``, as decided before the clean-up: pass it to
        ``PlanCache.lookup(..., avoid=...)``."""
        avoid: set[str] = set()
        crashed: list[Mark] = []
        with self._opened() as held:
            if held is None:
                return frozenset()
            for name, fd, mark in self._read(held, fingerprint):
                if name.endswith(CRASHED_SUFFIX):
                    avoid.add(mark.observation.digest)
                elif mark.locked and mark.process.gone(fd):
                    record = name.removesuffix(MARK_SUFFIX) + CRASHED_SUFFIX
                    try:  # under the lock just taken: one boot wins a mark
                        held.rename(name, held, record)
                    except OSError:
                        continue
                    avoid.add(mark.observation.digest)
                    crashed.append(mark)
            self._clean(held, self.max_age, keep=fingerprint)
        for mark in crashed:
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
        return frozenset(avoid)

    def avoided(self, fingerprint: str) -> frozenset[str]:
        """Digests of the observations of ``fingerprint`` a boot on this node crashed with."""
        with self._opened() as held:
            if held is None:
                return frozenset()
            return frozenset(
                mark.observation.digest
                for name, _, mark in self._read(held, fingerprint)
                if name.endswith(CRASHED_SUFFIX)
            )

    def clean(self, older_than: float | None = None, *, dry_run: bool = False) -> int:
        """Remove marks and crash records dated more than ``older_than`` (default ``max_age``)
        from now and past ``max_marks`` the oldest; returns how many were (or, with
        ``dry_run``, would be) removed. Never raises."""
        with self._opened() as held:
            if held is None:
                return 0
            limit = self.max_age if older_than is None else older_than
            return self._clean(held, limit, dry_run=dry_run)

    # -- files -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _opened(self, create: bool = False) -> Iterator[Directory | None]:
        """The directory's guarded handle, or None where it is missing, unusable (logged) or
        writable by another user (logged once per process). With ``create`` (to write a
        mark): created 0700 if missing, made private if it is ours, and ``OSError`` raised
        instead of None."""
        try:
            held = self._open_dir(create)
        except OSError as exc:
            if create:
                raise
            log.warning("plancache: crash marks in %s not read: %s", self.directory, exc)
            held = None
        try:
            yield held
        finally:
            if held is not None:
                held.close()

    def _open_dir(self, create: bool) -> Directory | None:
        """The directory's descriptor, through its guarded handle (its parent the anchor: a
        link planted as the directory is never followed); judged by the one foreign-writer
        rule (made private first where it is this user's and ``create``)."""
        anchor, name = self.directory.parent, self.directory.name
        if create:
            held = Directory.make(anchor, name, mode=0o700)
        else:
            found = Directory.open(anchor, name)
            if found is None:
                return None
            held = found
        try:
            if create:
                held.private()  # judges it again
            if held.foreign is None:
                return held
            st = os.fstat(held.fd)
        except BaseException:
            held.close()
            raise
        held.close()
        _distrust(self.directory, st)
        if create:
            raise PermissionError("another user can write the directory")
        return None

    def _read(self, held: Directory, fingerprint: str) -> Iterator[tuple[str, int, Mark]]:
        """(name, open descriptor, mark) for each mark and crash record of ``fingerprint``: a
        regular file that no other user can write (others are logged, once per process),
        opened without following links or waiting; the descriptor is closed when the
        iteration moves on."""
        prefix = fingerprint[:16] + "."
        for name in sorted(self._names(held)):
            if not name.startswith(prefix):
                continue
            try:
                opened = held.open_file(name)
            except OSError:  # a symbolic link, a FIFO, a device
                continue
            if opened is None:  # gone
                continue
            fd, st, why = opened
            try:
                if why is not None:
                    _distrust(self.directory / name, st)
                    continue
                mark = Mark.parse(self.directory / name, os.read(fd, MAX_MARK_BYTES))
                if mark is not None and mark.fingerprint == fingerprint:
                    yield name, fd, mark
            except OSError:
                continue
            finally:
                os.close(fd)

    def _clean(
        self, held: Directory, limit: float, *, dry_run: bool = False, keep: str | None = None
    ) -> int:
        """``clean`` in the open directory; the files of the key ``keep`` are only removed by
        age. Entries that are not regular files are skipped."""
        now = time.time()
        files: list[tuple[float, str, os.stat_result]] = []
        for name in self._names(held):
            try:
                st = held.lstat(name)
            except OSError:
                continue
            if st is not None and stat.S_ISREG(st.st_mode):
                files.append((st.st_mtime, name, st))
        files.sort(reverse=True)
        mine = None if keep is None else keep[:16] + "."
        kept = removed = 0
        for mtime, name, st in files:
            if abs(now - mtime) <= limit and (
                kept < self.max_marks or (mine is not None and name.startswith(mine))
            ):
                kept += 1
                continue
            try:
                if not dry_run:
                    held.remove(name, st)
            except OSError as exc:
                log.debug("plancache: crash mark %s not removed: %s", name, exc)
                continue
            removed += 1
        return removed

    def _names(self, held: Directory) -> list[str]:
        """Names of marks and crash records in the open directory (none if it cannot be
        listed: logged)."""
        try:
            names = held.names()
        except OSError as exc:
            log.warning("plancache: crash marks in %s not read: %s", self.directory, exc)
            return []
        return [n for n in names if n.endswith((MARK_SUFFIX, CRASHED_SUFFIX))]

    def _create(self, name: str, data: bytes) -> int:
        """Create ``name`` (0600, never following or replacing an entry), lock it, then write
        ``data``: a reader that sees the content knows that the lock was taken. Returns the
        descriptor that holds the lock; the fsync runs on a daemon thread."""
        with self._opened(create=True) as held:
            assert held is not None
            fd = held.create(name, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.write(fd, data)
                synced = (os.dup(fd), os.dup(held.fd))
                background.start(lambda: _sync(name, *synced), "plancache-mark")
            except BaseException:
                with contextlib.suppress(OSError):
                    held.remove(name, os.fstat(fd))
                os.close(fd)
                raise
        return fd


def _sync(name: str, fd: int, dir_fd: int) -> None:
    """fsync the mark ``name`` and its directory (descriptors of both, closed here); a
    failure is logged (the mark is in place either way)."""
    try:
        os.fsync(fd)
        os.fsync(dir_fd)
    except OSError as exc:
        log.debug("plancache: crash mark %s not synced: %s", name, exc)
    finally:
        os.close(fd)
        os.close(dir_fd)
