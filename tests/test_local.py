"""The local store: the conformance suite plus what only a filesystem can show."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import Plan, PlanCache, PlanStoreError, PutOutcome
from plancache._backends.local import LocalStore
from plancache._keys import plan_object_name
from plancache._store import PlanStore
from plancache.errors import PlanStorePermissionError
from plancache.testing import FACTORS, StoreContract, child_env, make_plan
from plancache.testing.contract import StoreSpec, WriteRaw
from tests.helpers import local_layer


def write_file(root: Path) -> WriteRaw:
    """Writes a record's file under ``root`` directly."""

    def write(fp: str, data: bytes) -> None:
        root.mkdir(parents=True, exist_ok=True)
        (root / plan_object_name(fp)).write_bytes(data)

    return write


class TestLocalContract(StoreContract):
    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> StoreSpec:
        return str(tmp_path / "plans"), {}

    @pytest.fixture
    def write_raw(self, tmp_path: Path) -> WriteRaw:
        return write_file(tmp_path / "plans")


class TestFileUrlContract(StoreContract):
    race_processes = 4

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> StoreSpec:
        return f"file://{tmp_path}/plans", {}

    @pytest.fixture
    def write_raw(self, tmp_path: Path) -> WriteRaw:
        return write_file(tmp_path / "plans")


def test_files_are_named_for_standard_tools(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path))
    plan = make_plan()
    store.put(plan)
    assert (tmp_path / f"startup_plan_{plan.fingerprint}.json").read_bytes() == plan.encode()
    assert local_layer(store).temp_files() == []


def test_other_files_in_the_directory_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "startup_plan_zz.json").write_text("{}")
    assert list(PlanStore(LocalStore(tmp_path)).iter_fingerprints()) == []


def test_stale_temp_files_are_removed_and_fresh_ones_kept(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path))
    store.put(make_plan())
    old = tmp_path / ".startup_plan_x.host.1.abcd.tmp"
    new = tmp_path / ".startup_plan_y.host.2.ef01.tmp"
    old.write_bytes(b"{")
    new.write_bytes(b"{")
    past = time.time() - 7200
    os.utime(old, (past, past))
    assert store.layer.remove_stale_temp_files() == 1
    assert not old.exists() and new.exists()
    assert store.layer.remove_stale_temp_files(older_than=0) == 1


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``path`` for the test (skipped where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with _tmpfs(tmp_path / "tiny", "size=16k") as mnt:
        yield mnt


@pytest.fixture
def readonly_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with _tmpfs(tmp_path / "ro", "size=64k,ro") as mnt:
        yield mnt


def test_full_disk_is_a_store_error_and_leaves_no_temp_file(tiny_tmpfs: Path) -> None:
    with open(tiny_tmpfs / "filler", "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * 64 * 1024)  # fills the 16 KiB tmpfs
    store = PlanStore(LocalStore(tiny_tmpfs))
    big = Plan.new(
        {**FACTORS, "pad": "x" * 20_000}, kv_cache_memory_bytes=1, free_memory_baseline=2
    )
    with pytest.raises(PlanStoreError, match="No space"):
        store.put(big)
    assert local_layer(store).temp_files() == []
    assert store.get(big.fingerprint) is None
    cache = PlanCache(store)
    recorded = cache.record(FACTORS, kv_cache_memory_bytes=1, free_memory_baseline=2)
    assert (recorded.reason, recorded.outcome) == ("store-error", None)
    assert "No space" in recorded.detail
    assert local_layer(store).temp_files() == []


def test_read_only_filesystem_is_a_permission_error(readonly_tmpfs: Path) -> None:
    store = PlanStore(LocalStore(readonly_tmpfs / "plans"))
    assert store.get(make_plan().fingerprint) is None
    with pytest.raises(PlanStorePermissionError, match="Read-only"):
        store.put(make_plan())
    with pytest.raises(PlanStorePermissionError):
        PlanStore(LocalStore(readonly_tmpfs)).put(make_plan())


UNREADABLE = """
import os, sys
from plancache import PlanStoreError, PlanCache, PlanStore
from plancache._backends.local import LocalStore
from plancache.testing import FACTORS, make_plan
if os.geteuid() == 0:
    os.setgid(65534); os.setuid(65534)
store = PlanStore(LocalStore(sys.argv[1]))
try:
    store.get(make_plan().fingerprint)
except PlanStoreError as exc:
    print(type(exc).__name__, exc)
d = PlanCache(store).lookup(dict(make_plan().factors), 80 << 30)
r = PlanCache(store).record(dict(make_plan().factors), kv_cache_memory_bytes=1,
                            free_memory_baseline=2)
print(d.reason, r.reason)
"""


def test_unreadable_directory_is_a_permission_error_and_a_miss(tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    PlanStore(LocalStore(plans)).put(make_plan())
    plans.chmod(0o000)
    tmp_path.chmod(0o755)
    try:
        out = subprocess.run(
            [sys.executable, "-c", UNREADABLE, str(plans)],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )
    finally:
        plans.chmod(0o755)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("PlanStorePermissionError") and "Permission denied" in lines[0]
    assert lines[1] == "store-error store-error"


def test_put_outcome_values_are_stable() -> None:
    assert [o.value for o in PutOutcome] == ["created", "replaced", "kept"]
