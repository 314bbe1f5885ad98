"""The crash-loop breaker with real processes SIGKILLed after applying a plan: the next boot
profiles, the observation leaves the shared store (local, S3, GCS), a node with an empty
local tier does not apply it, and read-only nodes stop applying it without writing. A live
boot in another PID namespace is no crash; FIFOs and links named like marks, a flood of newer
files, odd entries, and marks that another user could write do not change that."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import plancache._breaker
from plancache import PlanCache, PlanStore, open_store
from plancache._backends.local import LocalStore
from plancache._breaker import CRASHED_SUFFIX, LOCK, MARK_SUFFIX, MAX_MARKS, Breaker, Process
from plancache._inventory.plans import prune
from plancache._observation import Observation
from plancache.testing import GiB, child_env, make_plan
from plancache.testing.servers import CountingProxy
from tests.helpers import (
    LOOSE_OPTIONS,
    ODD_ENTRIES,
    dead_mark,
    local_layer,
    plant_odd_entry,
    within,
)

REPO = Path(__file__).resolve().parent.parent
BAD = make_plan(kv=30 * GiB, baseline=70 * GiB)
GOOD = make_plan(kv=10 * GiB, baseline=60 * GiB)
FP = BAD.fingerprint
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
"""A command prefix: the command runs as PID 1 of a new PID namespace (a container)."""


def _pid_namespaces() -> str | None:
    """Why this machine cannot run commands in a new PID namespace; None if it can."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        return "no /proc/PID/task/TID/children to find the namespace's first process"
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if done.returncode == 0 else f"unshare failed: {done.stderr.strip()}"


_NO_PID_NAMESPACES = _pid_namespaces()
needs_pid_namespaces = pytest.mark.skipif(
    _NO_PID_NAMESPACES is not None, reason=f"needs PID namespaces: {_NO_PID_NAMESPACES}"
)


def _child_of(pid: int) -> int:
    """The one child of process ``pid`` (as this PID namespace numbers it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError(f"process {pid} has no child")


class Node:
    """A node: its own local directory (tier or store) and the shared store's settings."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = child_env([REPO], VLLM_CACHE_ROOT=str(home / "vllm"), **env)

    def _command(self, mode: str, namespace: bool) -> list[str]:
        return [*(UNSHARE if namespace else []), sys.executable, "-m", "tests.breaker_node", mode]

    def boot(self, *, namespace: bool = False, timeout: float = 120) -> tuple[dict[str, Any], str]:
        """A boot that completes (in a new PID namespace: a container); (decision, log)."""
        done = subprocess.run(
            self._command("boot", namespace),
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1]), done.stderr

    @contextlib.contextmanager
    def applying(self, *, namespace: bool = False) -> Iterator[dict[str, Any]]:
        """A boot that applied the plan and is inside the warm-up, alive, while the context
        lasts (the decision); SIGKILLed at its end (and reaped: its locks are released)."""
        child = subprocess.Popen(
            self._command("die", namespace),
            env=self.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert child.stdout is not None
            decision: dict[str, Any] = json.loads(child.stdout.readline())
            assert decision["reason"] == "hit"
            assert len(list(self.marks.glob("*" + MARK_SUFFIX))) == 1  # written before it went on
            yield decision
        finally:
            # in a namespace: kill its PID 1, which ends the namespace; unshare then reaps it
            os.kill(_child_of(child.pid) if namespace else child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        assert child.returncode != 0

    def crash(self) -> dict[str, Any]:
        """A boot SIGKILLed after it applied the plan (inside the warm-up)."""
        with self.applying() as decision:
            return decision

    @property
    def marks(self) -> Path:
        """Where this node's boots leave their marks (as ``Settings.local_dir`` says)."""
        tier = self.env.get("PLANCACHE_LOCAL_TIER", "1")
        url = self.env["PLANCACHE_URL"]
        if "://" not in url:
            return Path(url) / "marks"
        if tier not in ("0", "1"):
            return Path(tier) / "marks"
        return self.home / "vllm" / "startup_plan" / "marks"


def _remote_env(kind: str, request: pytest.FixtureRequest) -> tuple[dict[str, str], PlanStore]:
    if kind == "s3":
        proxy: CountingProxy = request.getfixturevalue("s3_proxy")
        url = f"s3://{request.getfixturevalue('s3_bucket')}/plans"
        options: dict[str, object] = {"endpoint_url": proxy.endpoint, **LOOSE_OPTIONS}
    else:
        proxy = request.getfixturevalue("gcs_proxy")
        url = f"gs://{request.getfixturevalue('gcs_bucket')}/plans"
        options = {"endpoint_url": proxy.endpoint, "token": "anon", **LOOSE_OPTIONS}
    env = {"PLANCACHE_URL": url, "PLANCACHE_STORAGE_OPTIONS": json.dumps(options)}
    return env, open_store(url, **options)


@pytest.fixture(params=["local", "s3", "gcs"])
def shared(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[dict[str, str], PlanStore]]:
    if request.param == "local":
        store: PlanStore = PlanStore(LocalStore(tmp_path / "shared"))
        yield {"PLANCACHE_URL": str(store.url)}, store
    else:
        env, store = _remote_env(request.param, request)
        yield env, store
        store.close()


def _node(tmp_path: Path, name: str, env: dict[str, str], **extra: str) -> Node:
    home = tmp_path / name
    tier = (
        {}
        if not env["PLANCACHE_URL"].count("://")
        else {"PLANCACHE_LOCAL_TIER": str(home / "tier")}
    )
    return Node(home, {**env, **tier, **extra})


def test_a_crash_after_applying_costs_one_boot_per_node(
    shared: tuple[dict[str, str], PlanStore], tmp_path: Path
) -> None:
    env, store = shared
    store.put(BAD)
    a = _node(tmp_path, "a", env)
    assert a.crash()["kv"] == 30 * GiB
    start = time.perf_counter()
    decision, log = a.boot()
    assert decision["reason"] != "hit" and decision["kv"] is None  # profiles
    assert "gate:crashed-before" in log and "retracted" in log
    stored = store.get(FP)
    assert stored is not None and stored.observations == ()  # gone from the shared store
    assert [t.observation for t in stored.retracted] == [BAD.observations[0].digest]
    assert list(a.marks.glob("*" + CRASHED_SUFFIX)) and not list(a.marks.glob("*" + MARK_SUFFIX))
    c = _node(tmp_path, "c", env)  # a third node, empty local tier
    assert c.boot()[0]["kv"] is None
    assert a.boot()[0]["kv"] is None  # and the node stays off it
    store.put(BAD)  # a stale copy merged back in changes nothing
    assert c.boot()[0]["kv"] is None
    print(f"recovery boot + checks: {time.perf_counter() - start:.2f}s")


def test_the_other_observations_of_the_record_still_apply(
    shared: tuple[dict[str, str], PlanStore], tmp_path: Path
) -> None:
    env, store = shared
    store.put(GOOD)
    store.put(BAD)
    a = _node(tmp_path, "a", env)
    assert a.crash()["kv"] == 30 * GiB
    assert a.boot()[0] == {"reason": "hit", "kv": 10 * GiB}
    assert store.get(FP) is not None and store.get(FP).observations == GOOD.observations  # type: ignore[union-attr]
    assert _node(tmp_path, "c", env).boot()[0] == {"reason": "hit", "kv": 10 * GiB}


@pytest.mark.parametrize("kind", ["s3", "gcs"])
@pytest.mark.parametrize("tier", [True, False])
def test_read_only_nodes_stop_applying_it_without_writing(
    kind: str, tier: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env, store = _remote_env(kind, request)
    store.put(BAD)
    proxy: CountingProxy = request.getfixturevalue(f"{kind}_proxy")
    extra = {"PLANCACHE_READ_ONLY": "1"}
    if not tier:
        extra["PLANCACHE_LOCAL_TIER"] = "0"
    a = _node(tmp_path, "a", env, **extra)
    proxy.reset()
    a.crash()
    decision, log = a.boot()
    assert decision["kv"] is None
    # with a tier, the local tier's tombstone already removes it from the record read
    assert decision["reason"] == ("miss" if tier else "gate:crashed-before")
    assert "gate:crashed-before" in log
    if not tier:  # it wrote nothing, and says so
        assert "plancache: retracted" not in log and "plancache: not retracted" in log, log
    assert a.boot()[0]["kv"] is None
    assert not [r for r in proxy.requests if r[0] in WRITES], proxy.requests
    assert proxy.requests  # it did read
    assert store.get(FP) == BAD  # read-only: the shared record is as it was


# -- the pieces --------------------------------------------------------------------------------
@needs_pid_namespaces
def test_a_live_boot_in_another_pid_namespace_is_not_judged_crashed(tmp_path: Path) -> None:
    """Two containers on one node share the marks directory and the host name, not the PID
    namespace; the first is warming up with the plan applied when the second boots, and a
    container restart comes back in a new PID namespace."""
    store = PlanStore(LocalStore(tmp_path / "shared"))
    store.put(BAD)
    a = _node(tmp_path, "a", {"PLANCACHE_URL": store.url})
    with a.applying(namespace=True):
        for namespace in (False, True):
            decision, log = a.boot(namespace=namespace)
            assert decision == {"reason": "hit", "kv": 30 * GiB}, log
            assert "gate:crashed-before" not in log
        assert store.get(FP) == BAD
        assert len(list(a.marks.glob("*" + MARK_SUFFIX))) == 1  # the live one's, untouched
    decision, log = a.boot(namespace=True)  # it was killed: the container restarts
    assert decision["kv"] is None and "gate:crashed-before" in log
    stored = store.get(FP)
    assert stored is not None and stored.observations == ()


def _plant(path: Path, observation: Observation, **fields: object) -> None:
    """A mark at ``path`` that nobody holds, written as a file (0600) rather than armed."""
    me = Process.current()
    mark: dict[str, object] = {
        "fingerprint": FP,
        "observation": observation.to_dict(),
        "pid": _dead_pid(),
        "start_time": None,
        "boot_id": me.boot_id,
        "host": me.host,
        "marked_at": time.time(),
        "lock": LOCK,
    }
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(json.dumps({**mark, **fields}).encode())
    path.chmod(0o600)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_marks_are_judged_only_where_their_lock_is_evidence(tmp_path: Path) -> None:
    """A mark's free lock means a dead writer on this kernel (same boot id, whatever the host
    name) and on this host after a reboot; not on another host, nor for an unlocked mark."""
    breaker = Breaker(tmp_path / "marks")
    cases: dict[Observation, tuple[dict[str, object], bool]] = {  # its mark's fields, judged
        make_plan(kv=1 * GiB).observations[0]: ({"host": "another-pod"}, True),
        make_plan(kv=2 * GiB).observations[0]: ({"boot_id": "before-a-reboot"}, True),
        make_plan(kv=3 * GiB).observations[0]: ({"boot_id": "b", "host": "elsewhere"}, False),
        make_plan(kv=4 * GiB).observations[0]: ({"lock": None}, False),  # an older version's
    }
    for i, (o, (fields, _)) in enumerate(cases.items()):
        _plant(breaker.directory / f"{FP[:16]}.{i}.x{MARK_SUFFIX}", o, **fields)
    store = PlanStore(LocalStore(tmp_path / "s"))
    crashed = {o.digest for o, (_, judged) in cases.items() if judged}
    assert breaker.recover(PlanCache(store), FP) == crashed
    assert len(list(breaker.directory.glob("*" + MARK_SUFFIX))) == 2


@pytest.mark.parametrize("suffix", [MARK_SUFFIX, CRASHED_SUFFIX])
@pytest.mark.parametrize("kind", ODD_ENTRIES)
def test_odd_entries_named_like_marks_are_skipped_without_waiting(
    kind: str, suffix: str, tmp_path: Path
) -> None:
    breaker = Breaker(tmp_path / "marks")
    breaker.directory.mkdir(mode=0o700)
    plant_odd_entry(kind, breaker.directory / f"{FP[:16]}.1.odd{suffix}", BAD)
    store = PlanStore(LocalStore(tmp_path / "s"))
    store.put(BAD)
    assert within(5, lambda: breaker.recover(PlanCache(store), FP)) == frozenset()
    assert within(5, lambda: breaker.avoided(FP)) == frozenset()
    assert store.get(FP) == BAD


def test_a_fifo_named_like_a_mark_does_not_hold_up_a_boot(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path / "shared"))
    store.put(BAD)
    a = _node(tmp_path, "a", {"PLANCACHE_URL": store.url, "PLANCACHE_TIMEOUT": "1"})
    a.marks.mkdir(mode=0o700, parents=True)
    os.mkfifo(a.marks / f"{FP[:16]}.1.fifo{MARK_SUFFIX}")
    os.mkfifo(tmp_path / "fifo")
    (a.marks / f"{FP[:16]}.2.link{CRASHED_SUFFIX}").symlink_to(tmp_path / "fifo")
    start = time.perf_counter()
    assert a.boot(timeout=15)[0] == {"reason": "hit", "kv": 30 * GiB}
    print(f"boot with FIFOs among the marks: {time.perf_counter() - start:.2f}s")


def _flood(directory: Path, n: int, mtime: float) -> None:
    """``n`` crash records of other keys, dated ``mtime``."""
    for i in range(n):
        path = directory / f"{i:016x}.{os.getpid()}.{secrets.token_hex(4)}{CRASHED_SUFFIX}"
        path.write_bytes(b"{}")
        path.chmod(0o600)
        os.utime(path, (mtime, mtime))


def test_a_crash_record_outlives_a_flood_of_newer_files(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path / "s"))
    store.put(BAD)
    breaker = Breaker.for_dir(local_layer(store).root)
    dead_mark(breaker.directory, FP, BAD.observations[0])
    _flood(breaker.directory, MAX_MARKS, time.time() + 3600)  # future-dated
    cache = PlanCache(store)
    crashed = frozenset({BAD.observations[0].digest})
    assert breaker.recover(cache, FP) == crashed
    _flood(breaker.directory, MAX_MARKS, time.time() + 7200)  # and newer still
    assert breaker.recover(cache, FP) == crashed == breaker.avoided(FP)
    assert len(list(breaker.directory.iterdir())) == MAX_MARKS + 1  # still bounded


def test_a_crash_loop_is_broken_on_a_read_only_node_after_a_flood_of_files(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """No local tier and no write access: the crash record is all this node has."""
    env, store = _remote_env("s3", request)
    store.put(BAD)
    a = _node(tmp_path, "a", env, PLANCACHE_READ_ONLY="1", PLANCACHE_LOCAL_TIER="0")
    a.crash()
    _flood(a.marks, MAX_MARKS, time.time() + 3600)
    decision, log = a.boot()
    assert decision == {"reason": "gate:crashed-before", "kv": None}, log
    assert a.boot()[0]["kv"] is None
    assert store.get(FP) == BAD


def test_odd_entries_do_not_stop_the_clean_up(tmp_path: Path) -> None:
    breaker = Breaker(tmp_path / "marks", max_marks=4)
    breaker.directory.mkdir(mode=0o700)
    _flood(breaker.directory, 6, time.time())
    for kind in ("symlink-loop", "directory"):
        plant_odd_entry(kind, breaker.directory / f"{kind}{MARK_SUFFIX}", BAD)
    assert breaker.clean(dry_run=True) == 2
    assert breaker.clean() == 2
    names = sorted(p.name for p in breaker.directory.iterdir())
    assert len(names) == 6 and names[-2:] == [
        f"directory{MARK_SUFFIX}",
        f"symlink-loop{MARK_SUFFIX}",
    ]


def test_the_marks_directory_and_marks_are_private(tmp_path: Path) -> None:
    b = Breaker.for_dir(tmp_path)
    umask = os.umask(0o002)
    try:
        mark = b.arm(FP, BAD.observations[0])
    finally:
        os.umask(umask)
    assert mark is not None
    assert stat.S_IMODE(mark.path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(mark.path.stat().st_mode) == 0o600
    b.disarm(mark)


@pytest.fixture
def distrust_warned_once() -> Iterator[None]:
    """A process that has not yet warned about marks that others could write."""
    plancache._breaker._distrusted.clear()
    yield
    plancache._breaker._distrusted.clear()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files another user's")
def test_marks_that_another_user_could_write_are_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, distrust_warned_once: None
) -> None:
    nobody = 65534
    store = PlanStore(LocalStore(tmp_path / "s"))
    store.put(BAD)
    cache = PlanCache(store)
    theirs = Breaker(tmp_path / "theirs")  # a directory another user owns
    _plant(theirs.directory / f"{FP[:16]}.1.x{MARK_SUFFIX}", BAD.observations[0])
    os.chown(theirs.directory, nobody, nobody)
    shared = Breaker(tmp_path / "shared")  # ours, but the group may write it
    planted = shared.directory / f"{FP[:16]}.2.x{MARK_SUFFIX}"  # by another user
    _plant(planted, BAD.observations[0])
    os.chown(planted, nobody, nobody)
    writable = shared.directory / f"{FP[:16]}.3.x{MARK_SUFFIX}"  # ours, anyone may write it
    _plant(writable, BAD.observations[0])
    writable.chmod(0o666)
    shared.directory.chmod(0o775)
    with caplog.at_level(logging.WARNING, logger="plancache"):
        for b in (theirs, shared, theirs, shared):
            assert b.recover(cache, FP) == frozenset()
        assert theirs.arm(FP, BAD.observations[0]) is None  # never written where it is ignored
        shared.disarm(shared.arm(FP, GOOD.observations[0]))  # ours: made private to write
    assert store.get(FP) == BAD  # nothing retracted
    assert caplog.text.count("can be written by another user") == 1, caplog.text
    assert stat.S_IMODE(shared.directory.stat().st_mode) == 0o755
    os.chown(planted, 0, 0)
    writable.chmod(0o600)  # the same marks, once only we could have written them, count
    assert shared.recover(cache, FP) == {BAD.observations[0].digest}


def test_a_live_boots_mark_is_left_alone(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path / "s"))
    store.put(BAD)
    breaker = Breaker.for_dir(tmp_path / "s")
    mark = breaker.arm(FP, BAD.observations[0])
    assert mark is not None and mark.path.exists()
    assert breaker.recover(PlanCache(store), FP) == frozenset()
    assert store.get(FP) == BAD and mark.path.exists()
    breaker.disarm(mark)
    assert not mark.path.exists()


def test_marks_are_bounded_in_number_and_age_and_pruned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = PlanStore(LocalStore(tmp_path))
    breaker = Breaker(tmp_path / "marks", max_marks=4)
    marks = [breaker.arm(FP, make_plan(kv=(i + 1) * GiB).observations[0]) for i in range(6)]
    for i, m in enumerate(marks):
        assert m is not None
        os.utime(m.path, (1000.0 + i, 1000.0 + i))
    newest = marks[5]
    assert newest is not None
    os.utime(newest.path)  # the newest, written now
    assert breaker.clean(dry_run=True) == 5  # 5 past the age bound (one is also past 4)
    assert len(list(breaker.directory.iterdir())) == 6
    assert breaker.clean(older_than=10**12) == 2  # the count bound alone
    assert len(list(breaker.directory.iterdir())) == 4
    result = prune(store, older_than=3600.0)
    assert result.marks == 3 and [p.name for p in breaker.directory.iterdir()] == [
        marks[5].path.name  # type: ignore[union-attr]
    ]


def test_an_unwritable_directory_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    breaker = Breaker(blocker / "marks")
    assert breaker.arm(FP, BAD.observations[0]) is None
    breaker.disarm(None)
    assert breaker.recover(PlanCache(PlanStore(LocalStore(tmp_path / "s"))), FP) == frozenset()
    assert breaker.clean() == 0


def test_a_local_store_holds_its_nodes_marks(tmp_path: Path) -> None:
    """``plancache prune`` cleans the marks beside a local store's plans, and only there."""
    breaker = Breaker.beside(PlanStore(LocalStore(tmp_path / "plans")))
    assert breaker is not None and breaker.directory == tmp_path / "plans" / "marks"
    assert Breaker.beside(open_store("memory://plans")) is None
