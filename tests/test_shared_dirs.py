"""What a local user who can write a shared directory (a hostPath with umask 002, a
group-writable ``TRITON_CACHE_DIR`` or ``VLLM_CACHE_ROOT``) can no longer do: every path
below such a directory goes through its guarded handle (``plancache._directory``) and is
judged by the one foreign-writer rule (``plancache._neighbours.foreign``). Issue 42, items
1-5 and 10; "another user" is uid 65534 where the tests run as root."""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import time
from pathlib import Path

import orjson
import pytest

from plancache._artifacts import archive, modelinfo, packing
from plancache._artifacts.modelinfo import ModelInfo
from plancache._command import caches as cache_command
from plancache._neighbours import MAX_DEPTH, foreign
from plancache._reasons import Reason
from plancache.caches import CacheFetched, CacheShare, directory_cache
from plancache.integrations.vllm.factors import MAX_EXPLAINED, keep_for_explain
from plancache.testing import child_env
from tests.artifacts.test_long_names import _left_out
from tests.cli.helpers import run

NOBODY = 65534
FACTORS = {"compiler": "1.2.3"}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root (chown)")


def _share(tmp_path: Path) -> CacheShare:
    return CacheShare.from_env(
        {"PLANCACHE_URL": str(tmp_path / "store"), "PLANCACHE_LOCAL_TIER": "0"}
    )


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "notes.txt"
    victim.parent.mkdir()
    victim.write_bytes(b"the user's own file")
    return victim


# -- item 1: the pull record never written through a planted link ----------------------------
def test_the_pull_record_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    cache = directory_cache("myjit", root, FACTORS)
    victim = _victim(tmp_path)
    record = f"{cache_command.RECORD_PREFIX}{cache.kind}-{cache.scope}.json"
    (root / f"{record}.{os.getpid()}.tmp").symlink_to(victim)  # the temp name 0.4.0 used
    cache_command._remember(cache, CacheFetched(Reason.HIT, known=frozenset({"ab/kernel.bin"})))
    assert victim.read_bytes() == b"the user's own file"
    assert cache_command._recorded(cache) == ({"ab/kernel.bin"}, set())
    assert (root / record).stat().st_mode & 0o777 == 0o600


# -- item 4: a FIFO or another user's record there stalls nothing and decides nothing --------
def _push(tmp_path: Path, root: Path, timeout: str = "120") -> dict[str, object]:
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    args = ("cache", "push", "--kind", "myjit", "--factor", "compiler=1.2.3")
    done = run(
        *args,
        "--dir",
        str(root),
        "--url",
        str(store),
        "--json",
        "--timeout",
        timeout,
        env=child_env(PLANCACHE_LOCAL_TIER="0"),
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _files(root: Path) -> None:
    for rel in ("ab/kernel.bin", "cd/kernel.json", "index.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(secrets.token_bytes(100))


def test_a_fifo_at_the_pull_record_does_not_stall_a_push(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _files(root)
    cache = directory_cache("myjit", root, FACTORS)
    os.mkfifo(root / f"{cache_command.RECORD_PREFIX}{cache.kind}-{cache.scope}.json")
    pushed = _push(tmp_path, root, timeout="20")  # 0.4.0 waited on the FIFO until then
    assert (pushed["files"], pushed["written"]) == (3, {"store": True})


@as_root
def test_another_user_s_pull_record_decides_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _files(root)
    cache = directory_cache("myjit", root, FACTORS)
    planted = root / f"{cache_command.RECORD_PREFIX}{cache.kind}-{cache.scope}.json"
    known = ["ab/kernel.bin", "cd/kernel.json", "index.txt"]  # "all stored: push nothing"
    planted.write_bytes(orjson.dumps({"kind": "myjit", "scope": cache.scope, "known": known}))
    os.chown(planted, NOBODY, NOBODY)
    pushed = _push(tmp_path, root)
    assert (pushed["files"], pushed["written"]) == (3, {"store": True})


# -- item 2: the explain directory never a planted link --------------------------------------
def test_a_planted_explain_link_neither_gets_a_file_nor_loses_one(tmp_path: Path) -> None:
    theirs = tmp_path / "users-json"
    theirs.mkdir()
    for i in range(MAX_EXPLAINED + 6):
        (theirs / f"doc{i:02}.json").write_bytes(b"{}")
        os.utime(theirs / f"doc{i:02}.json", (1_000_000 + i, 1_000_000 + i))
    local = tmp_path / "local"
    local.mkdir()
    (local / "explain").symlink_to(theirs)
    before = sorted(p.name for p in theirs.iterdir())
    with pytest.raises(OSError):
        keep_for_explain(local, "f" * 64, {"a": 1}, {})
    assert sorted(p.name for p in theirs.iterdir()) == before  # none added, none pruned


def test_explain_prunes_only_its_own_oldest_files(tmp_path: Path) -> None:
    local = tmp_path / "local"
    victim = _victim(tmp_path)
    for i in range(MAX_EXPLAINED + 2):
        keep_for_explain(local, f"{i:064x}", {"a": i}, {})
    (local / "explain" / "zz.json").symlink_to(victim)  # a link among them: never pruned
    os.utime(local / "explain" / "zz.json", (0, 0), follow_symlinks=False)
    keep_for_explain(local, "f" * 64, {"a": 1}, {})
    kept = list((local / "explain").glob("*.json"))
    assert len([p for p in kept if not p.is_symlink()]) == MAX_EXPLAINED
    assert victim.read_bytes() == b"the user's own file"
    assert (local / "explain").stat().st_mode & 0o777 == 0o700


# -- item 3: an install never writes outside its directory -----------------------------------
def test_a_bundle_install_never_follows_a_planted_directory_link(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "5e").mkdir(parents=True)
    (src / "5e" / "kernel.bin").write_bytes(b"kernel")
    (src / "7f").mkdir()
    (src / "7f" / "other.bin").write_bytes(b"other")
    _, chunks = packing.pack_cache(src, "triton", "5" * 64, packing.scan_cache(src))
    node, elsewhere = tmp_path / "node", tmp_path / "elsewhere"
    node.mkdir()
    elsewhere.mkdir()
    (node / "5e").symlink_to(elsewhere)
    _, installed = archive.install_cache(
        io.BytesIO(b"".join(chunks)), node, "triton", "5" * 64, accept=lambda m: None
    )
    assert list(elsewhere.iterdir()) == []
    assert installed == 1 and (node / "7f" / "other.bin").read_bytes() == b"other"


def _info() -> ModelInfo:
    file = {"hash": "h" * 32, "modelinfo": {"is_text_generation_model": True}}
    return ModelInfo("0.33.0", "vllm.model_executor.models.x", "X", file, time.time())


def test_a_model_info_install_never_follows_a_planted_directory_link(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "vllm", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "modelinfos").symlink_to(elsewhere)
    with pytest.raises(OSError):
        modelinfo.install(_info(), root / "modelinfos" / "x-X.json")
    assert list(elsewhere.iterdir()) == []


# -- item 5: another user's model-info file is not uploaded ----------------------------------
@as_root
def test_another_user_s_model_info_file_is_not_read_for_upload(tmp_path: Path) -> None:
    path = tmp_path / "vllm" / "modelinfos" / "x-X.json"
    assert modelinfo.install(_info(), path)
    assert modelinfo.read_file(path) == _info().file  # this user's: uploaded
    os.chown(path, NOBODY, NOBODY)  # swapped for another user's after vLLM wrote it
    assert modelinfo.read_file(path) is None


def test_a_model_info_file_everyone_may_write_is_not_read_for_upload(tmp_path: Path) -> None:
    path = tmp_path / "vllm" / "modelinfos" / "x-X.json"
    assert modelinfo.install(_info(), path)
    path.chmod(0o664)  # umask 002: this node's own, its group may write it: uploaded
    assert modelinfo.read_file(path) == _info().file
    path.chmod(0o666)
    assert modelinfo.read_file(path) is None


# -- item 10: a file too deep is counted and logged like a link ------------------------------
def test_a_file_too_deep_is_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    deep = root.joinpath(*["d"] * (MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / "kernel.bin").write_bytes(b"x")  # 33 directories deep
    (root / "d" / "kept.bin").write_bytes(b"x")
    caplog.set_level(logging.INFO, logger="plancache")
    before = _left_out("deep")
    with _share(tmp_path) as share:
        pushed = share.push(directory_cache("triton", root, FACTORS))
    assert pushed.files == 1
    assert _left_out("deep") - before == 1
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1 and f"1 directories more than {MAX_DEPTH} deep" in lines[0], lines


# -- the one foreign-writer rule -------------------------------------------------------------
def test_the_one_rule_names_who_else_could_have_written(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"")
    path.chmod(0o644)
    assert foreign(os.stat(path), "it") is None
    path.chmod(0o664)
    group = foreign(os.stat(path), "it")
    assert group is not None and group.group_only and group.owner is None
    path.chmod(0o646)
    others = foreign(os.stat(path), "it")
    assert others is not None and not others.group_only
    if os.geteuid() == 0:
        path.chmod(0o644)
        os.chown(path, NOBODY, NOBODY)
        owned = foreign(os.stat(path), "it")
        assert owned is not None and owned.owner == NOBODY and "uid 65534" in owned
