"""Odd local entries and the lock file: real FIFOs, sockets, symlinks, directories and
processes holding real ``flock`` locks."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plancache._backends.local import LOCK_NAME, LocalStore, _read_at_most
from plancache._keys import plan_object_name
from plancache._store import READ_LIMIT, PlanStore, PutOutcome
from plancache.errors import InvalidPlanError, PlanStoreError, PlanStoreUnavailableError
from plancache.testing import GiB, make_plan
from tests.helpers import ODD_ENTRIES, local_layer, plant_odd_entry, within

PLAN = make_plan()
VALID = make_plan(factors={"model": "valid/one", "rank": 0})


@pytest.fixture(params=ODD_ENTRIES)
def odd_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PlanStore]:
    store = PlanStore(LocalStore(tmp_path / "store"))
    store.put(VALID)
    plant_odd_entry(
        request.param, local_layer(store).root / plan_object_name(PLAN.fingerprint), PLAN
    )
    yield store
    path = local_layer(store).root / plan_object_name(PLAN.fingerprint)
    if path.is_fifo():  # wake a reader blocked in open() (the code before the fix)
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_odd_entry_is_invalid_listed_deletable_and_replaced_by_a_record(
    odd_store: PlanStore,
) -> None:
    store = odd_store
    with pytest.raises(InvalidPlanError, match="not a stored object"):
        within(2, lambda: store.get(PLAN.fingerprint))
    with pytest.raises(InvalidPlanError):
        within(2, lambda: store.read_raw(PLAN.fingerprint))
    assert sorted(store.iter_fingerprints()) == sorted([VALID.fingerprint, PLAN.fingerprint])
    assert store.get(VALID.fingerprint) == VALID
    assert within(2, lambda: store.put(PLAN)) is PutOutcome.CREATED
    assert store.get(PLAN.fingerprint) == PLAN
    assert (local_layer(store).root / plan_object_name(PLAN.fingerprint)).is_file()


def test_odd_entry_is_deleted(odd_store: PlanStore) -> None:
    store = odd_store
    assert within(2, lambda: store.delete(PLAN.fingerprint)) is True
    assert not os.path.lexists(local_layer(store).root / plan_object_name(PLAN.fingerprint))
    assert list(store.iter_fingerprints()) == [VALID.fingerprint]


def test_a_stale_temp_directory_does_not_fail_the_cleanup(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path))
    store.put(VALID)
    odd = tmp_path / f".{plan_object_name(PLAN.fingerprint)}.host.1.ab.x.tmp"
    odd.mkdir()
    stale = tmp_path / f".{plan_object_name(PLAN.fingerprint)}.host.2.cd.y.tmp"
    stale.write_bytes(b"{")
    os.utime(odd, (0, 0))
    os.utime(stale, (0, 0))
    assert store.layer.remove_stale_temp_files() == 1
    assert not stale.exists() and odd.is_dir()


# -- the lock file ------------------------------------------------------------------------
def test_a_planted_lock_symlink_is_never_followed(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path / "store"))
    store.put(make_plan(kv=10 * GiB))
    victim = tmp_path / "victim"
    (local_layer(store).root / LOCK_NAME).symlink_to(victim)
    with pytest.raises(PlanStoreError, match="symbolic link"):
        store.put(make_plan(kv=20 * GiB))  # a replace: takes the lock
    assert not os.path.lexists(victim)


def test_the_lock_file_mode_suits_a_group_shared_store(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path))
    old = os.umask(0o002)
    try:
        store.put(make_plan(kv=10 * GiB))
        store.put(make_plan(kv=20 * GiB))
    finally:
        os.umask(old)
    assert (tmp_path / LOCK_NAME).stat().st_mode & 0o777 == 0o664


HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def _hold(lock: Path) -> subprocess.Popen[str]:
    """A process holding ``flock`` on ``lock`` until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def test_lock_waits_are_bounded(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path))
    store.put(PLAN)
    local_layer(store).lock_timeout = 0.5
    holder = _hold(tmp_path / LOCK_NAME)
    try:
        with pytest.raises(PlanStoreUnavailableError, match="held the lock"):
            within(30, lambda: store.delete(PLAN.fingerprint))
        assert holder.poll() is None  # the holder never let go: the wait's own bound ended it
    finally:
        _release(holder)
    assert store.get(PLAN.fingerprint) == PLAN
    assert store.delete(PLAN.fingerprint) is True


def _waits_on(lock: os.stat_result) -> bool:
    """True while a descriptor of this process is open on the file ``lock`` is of (the
    store keeps the lock file it waits on open until it gives up or holds it)."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/self/fd/{fd}")
            if (st.st_dev, st.st_ino) == (lock.st_dev, lock.st_ino):
                return True
    return False


def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Return once ``condition()`` holds; fail the test saying ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.01)


def test_a_lock_file_replaced_while_waited_for_is_not_trusted(tmp_path: Path) -> None:
    """A waits on the lock file's first inode; the file is replaced and B locks the new one;
    A's holder exits. A takes the old lock, sees that it no longer guards the store and waits
    for B instead: it deletes only once B has let go."""
    store = PlanStore(LocalStore(tmp_path))
    store.put(PLAN)
    local_layer(store).lock_timeout = 60.0  # never reached: every wait below ends on a condition
    lock = tmp_path / LOCK_NAME
    first = _hold(lock)
    old = lock.stat()
    box: dict[str, object] = {}

    def delete() -> None:
        try:
            box["value"] = store.delete(PLAN.fingerprint)
        except BaseException as exc:
            box["error"] = exc

    waiter = threading.Thread(target=delete, daemon=True)
    waiter.start()
    second: subprocess.Popen[str] | None = None
    try:
        _until(lambda: _waits_on(old), "A waits on the first lock file")
        lock.unlink()
        second = _hold(lock)
        new = lock.stat()
        _release(first)
        # A can open the new file only after it held the old lock and found it replaced
        _until(lambda: _waits_on(new), "A, holding the replaced lock, waits on the new one")
        assert waiter.is_alive() and box == {}
        assert store.get(PLAN.fingerprint) == PLAN  # nothing deleted while B holds the lock
    finally:
        if second is not None:
            _release(second)
        if first.returncode is None:
            _release(first)
    waiter.join(10)
    assert not waiter.is_alive()
    assert box == {"value": True}
    assert store.get(PLAN.fingerprint) is None


def test_a_read_takes_the_size_fstat_gave_and_reads_a_shrunk_file_to_its_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with open(path, "rb") as f:
        assert _read_at_most(f.fileno(), 40) == b"x" * 40  # it grew after fstat: read as is
    with open(path, "rb") as f:
        assert _read_at_most(f.fileno(), 500) == b"x" * 100  # it shrank: read to its end
    with open(path, "rb") as f:
        assert _read_at_most(f.fileno(), 0) == b"x" * 100  # a size of 0 says nothing
    path.write_bytes(b"y" * (3 * READ_LIMIT))
    with open(path, "rb") as f:
        assert len(_read_at_most(f.fileno(), 3 * READ_LIMIT)) == READ_LIMIT
    with open(path, "rb") as f:
        assert len(_read_at_most(f.fileno(), 10)) == 10
