"""The crash-loop breaker with real processes SIGKILLed after applying a plan: the next boot
profiles, the observation leaves the shared store (local, S3, GCS), a node with an empty
local tier does not apply it, and read-only nodes stop applying it without writing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plancache import PlanCache, PlanStore, open_store
from plancache.backends.local import LocalStore
from plancache.breaker import CRASHED_SUFFIX, MARK_SUFFIX, Breaker, Process
from plancache.inventory import prune
from plancache.testing import GiB, child_env, make_plan
from plancache.testing.servers import CountingProxy

REPO = Path(__file__).resolve().parent.parent
BAD = make_plan(kv=30 * GiB, baseline=70 * GiB)
GOOD = make_plan(kv=10 * GiB, baseline=60 * GiB)
FP = BAD.fingerprint
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


class Node:
    """A node: its own local directory (tier or store) and the shared store's settings."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = child_env([REPO], VLLM_CACHE_ROOT=str(home / "vllm"), **env)

    def boot(self) -> tuple[dict[str, Any], str]:
        """A boot that completes; (decision, log)."""
        done = subprocess.run(
            [sys.executable, "-m", "tests.breaker_node", "boot"],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1]), done.stderr

    def crash(self) -> dict[str, Any]:
        """A boot SIGKILLed after it applied the plan (inside the warm-up)."""
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.breaker_node", "die"],
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
            marks = list((self.marks).glob("*" + MARK_SUFFIX))
            assert len(marks) == 1  # written before the boot went on
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL
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
        options: dict[str, str] = {"endpoint_url": proxy.endpoint}
    else:
        proxy = request.getfixturevalue("gcs_proxy")
        url = f"gs://{request.getfixturevalue('gcs_bucket')}/plans"
        options = {"endpoint_url": proxy.endpoint, "token": "anon"}
    env = {"PLANCACHE_URL": url, "PLANCACHE_STORAGE_OPTIONS": json.dumps(options)}
    return env, open_store(url, **options)


@pytest.fixture(params=["local", "s3", "gcs"])
def shared(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[dict[str, str], PlanStore]]:
    if request.param == "local":
        store: PlanStore = LocalStore(tmp_path / "shared")
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
    assert a.boot()[0]["kv"] is None
    assert not [r for r in proxy.requests if r[0] in WRITES], proxy.requests
    assert proxy.requests  # it did read
    assert store.get(FP) == BAD  # read-only: the shared record is as it was


# -- the pieces --------------------------------------------------------------------------------
def test_a_reused_pid_a_zombie_and_another_host_are_told_apart(tmp_path: Path) -> None:
    me = Process.current()
    assert me.alive() is True
    assert Process(me.pid, (me.start_time or 0) + 1, me.boot_id, me.host).alive() is False
    assert Process(me.pid, me.start_time, "another-boot", me.host).alive() is False
    assert Process(me.pid, me.start_time, me.boot_id, me.host + "-other").alive() is None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = Process(child.pid, None, me.boot_id, me.host)
        assert start.alive() is True
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while start.alive() and time.monotonic() < deadline:  # a zombie until reaped
            time.sleep(0.01)
        assert start.alive() is False
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_live_boots_mark_is_left_alone(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
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
    store = LocalStore(tmp_path)
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
    assert breaker.recover(PlanCache(LocalStore(tmp_path / "s")), FP) == frozenset()
    assert breaker.clean() == 0
