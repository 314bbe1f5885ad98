"""What killed writers and installs leave behind is cleaned (once old enough that no live one
can be at work): a write's temp files by ``prune``, an install's partial extraction by the
fetch and by ``prune``, wherever the kind installs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from plancache.testing import child_env
from tests.kinds.helpers import DAY, KEY, RANK, artifacts, cli, output, upload


# -- what killed writers and installs leave behind -----------------------------------------
def _age(path: Path, seconds: float) -> None:
    """Date ``path`` (and everything below it) ``seconds`` ago."""
    then = time.time() - seconds
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.utime(p, (then, then), follow_symlinks=False)


def test_prune_removes_stale_temp_files_of_artifacts(tmp_path: Path) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    size = path.stat().st_size
    # what LocalBlobs.create leaves when its writer is killed: .{name}.{host}.{pid}.{rand}.*.tmp
    stale = root / f".{path.name}.deadhost.4242.0badf00d.k1ll3d.tmp"
    live = root / f".{path.name}.livehost.4343.feedbeef.wr1t1n.tmp"
    for temp in (stale, live):
        with open(temp, "wb") as f:
            f.truncate(size)
    _age(stale, 2 * DAY)
    result = cli("prune", "--older-than", "1d", str(root))
    assert result.returncode == 0, output(result)
    assert not stale.exists(), f"an abandoned temp file of an artifact is left:\n{output(result)}"
    assert live.exists()  # a writer may still be at work
    assert path.exists()


def test_fetch_removes_stale_leftovers_of_a_killed_install(tmp_path: Path) -> None:
    root = tmp_path / "store"
    upload(root, tmp_path)
    target = tmp_path / "vllm" / "torch_compile_cache" / "torch_aot_compile" / KEY
    # what install leaves when its boot is killed: <target>/.plancache-tmp-<host>-<pid>-<hex>/
    stale = target / ".plancache-tmp-deadhost-4242-0badf00d"
    live = target / ".plancache-tmp-livehost-4343-feedbeef"
    for temp in (stale, live):
        (temp / RANK).mkdir(parents=True)
        (temp / RANK / "model").write_bytes(os.urandom(4096))
        (temp / "inductor_cache").mkdir()
    _age(stale, 2 * 3600)
    store = artifacts(str(root))
    try:
        fetched = store.fetch(target, KEY, RANK)
    finally:
        store.close()
    assert fetched.reason == "hit"
    assert not stale.exists(), f"left over: {sorted(p.name for p in target.iterdir())}"
    assert live.exists()  # another process may still be installing


def test_killed_bundle_installs_are_cleaned_wherever_they_install(tmp_path: Path) -> None:
    """A boot killed while installing an ``inductor`` bundle left its partial extraction in
    ``<key>/inductor_cache/.plancache-tmp-*`` for good (prune and the artifact fetch looked
    only in ``<key>/``), and one of a Triton bundle in Triton's cache until the next pull;
    now the fetch and ``prune`` clean both."""
    root = tmp_path / "store"
    upload(root, tmp_path)
    vllm = tmp_path / "vllm"
    target = vllm / "torch_compile_cache" / "torch_aot_compile" / KEY
    triton = tmp_path / "triton"
    stale = [
        target / "inductor_cache" / ".plancache-tmp-deadhost-4242-0badf00d",
        triton / ".plancache-tmp-deadhost-4242-0badf00e",
    ]
    for temp in stale:
        (temp / "ab").mkdir(parents=True)
        (temp / "ab" / "kernel.so").write_bytes(os.urandom(4096))
        _age(temp, 2 * 3600)
    store = artifacts(str(root))
    try:
        assert store.fetch(target, KEY, RANK).reason == "hit"
    finally:
        store.close()
    assert not stale[0].exists()
    (stale[0] / "ab").mkdir(parents=True)
    _age(stale[0], 2 * 3600)
    (vllm / "startup_plan").mkdir()  # this node's default store: prune's operand
    env = child_env(VLLM_CACHE_ROOT=str(vllm), TRITON_CACHE_DIR=str(triton))
    result = cli("prune", "--older-than", "1h", env=env)
    assert result.returncode == 0, output(result)
    assert not any(p.exists() for p in stale), output(result)
    assert f"deleted 1 partial install of killed boots in {triton}" in result.stdout
