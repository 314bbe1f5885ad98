"""torch's mega-cache through ``plancache.integrations.torch`` between fresh processes, each
with its own ``TORCHINDUCTOR_CACHE_DIR``: ``torch.compile`` of a small function on CPU, saved
signed by one process, loaded by another, whose compile is then an FX-graph cache hit
(Inductor's own counters, ``megacache_node.py``) with equal outputs (``tox -e vllm``: it has
torch)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plancache import open_store
from plancache.testing import child_env
from tests.vllm import support
from tests.vllm.support import HERE, REPO

pytest.importorskip("torch", reason="needs torch (tox -e vllm)")
pytestmark = pytest.mark.timeout(600)

NODE = HERE / "megacache_node.py"
KEY = secrets.token_hex(32)
OTHER = secrets.token_hex(32)


def _start(root: Path, store: Path, mode: str, key: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(NODE), mode, "small-fn"],
        env=child_env(
            [REPO],
            PLANCACHE_URL=str(store),
            PLANCACHE_SIGNING_KEY=key,
            TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
            TRITON_CACHE_DIR=str(root / "triton"),
            VLLM_CACHE_ROOT=str(root / "vllm"),
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reports(*procs: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out = []
    for code, report, log in support.outcomes(*procs, timeout=400):
        assert code == 0, log[-4000:]
        out.append({**report, "log": log})
    return out


def test_a_fresh_process_loads_the_saved_bytes_and_its_compile_hits(tmp_path: Path) -> None:
    store = tmp_path / "store"
    [saved] = _reports(_start(tmp_path / "a", store, "save", KEY))
    assert (saved["fxgraph_miss"], saved["fxgraph_hit"]) == (1, 0), saved["log"][-3000:]
    assert saved["bytes"] > 0 and saved["written"] == {"store": True}
    assert len(list(open_store(str(store)).layer.list_objects("cache_torch_mega_"))) == 1
    loaded, refused = _reports(
        _start(tmp_path / "b", store, "load-save", KEY),  # loads, compiles, saves
        _start(tmp_path / "c", store, "load", OTHER),  # signed by a key it does not accept
    )
    assert (loaded["reason"], loaded["loaded"]) == ("hit", 1), loaded["log"][-3000:]
    assert (loaded["fxgraph_hit"], loaded["fxgraph_miss"]) == (1, 0), loaded["log"][-3000:]
    assert loaded["autograd_hit"] >= 1
    assert loaded["output"] == saved["output"]
    # its save holds only what it loaded (in another order than torch's first save):
    # nothing new, nothing stored, said so
    assert loaded["bytes"] == 0 and loaded["loaded_left_out"] >= 2, loaded["log"][-3000:]
    assert "nothing new" in loaded["skipped"] and loaded["written"] == {}
    assert len(list(open_store(str(store)).layer.list_objects("cache_torch_mega_"))) == 1
    assert refused["reason"] in ("invalid", "untrusted"), refused["log"][-3000:]
    assert refused["loaded"] == 0
    assert (refused["fxgraph_hit"], refused["fxgraph_miss"]) == (0, 1)
    assert refused["output"] == saved["output"]


def test_the_same_artifacts_in_another_order_are_one_object(tmp_path: Path) -> None:
    from torch.compiler._cache import CacheArtifactManager

    from plancache.caches import CacheShare
    from plancache.integrations import torch as mega

    def saved(*artifacts: tuple[str, bytes]) -> bytes:
        """torch's own mega-cache bytes of ``artifacts`` (Inductor's), in that order."""
        CacheArtifactManager._ensure_cache_artifacts_registered()
        with CacheArtifactManager.with_fresh_cache():
            for key, content in artifacts:
                CacheArtifactManager.record_artifact("inductor", key, content)
            out = CacheArtifactManager.serialize()
        assert out is not None
        return bytes(out[0])

    one, two = ("k1", b"graph one"), ("k2", b"graph two")
    assert saved(one, two) != saved(two, one)  # torch's bytes follow its order
    store = tmp_path / "store"
    store.mkdir()
    env = {"PLANCACHE_URL": str(store), "PLANCACHE_LOCAL_TIER": "0"}
    with CacheShare.from_env(env) as share:
        first = mega.save("prog", saved(one, two), gpu="none", share=share)
        again = mega.save("prog", saved(two, one, one), gpu="none", share=share)
    assert len(list(store.glob("cache_torch_mega_*"))) == 1
    assert (again.written, again.sha256) == ({"store": False}, first.sha256)
    assert (first.written, first.artifacts) == ({"store": True}, 2)
    assert mega.said(again.written) == "stored already in the store"
    assert "not stored" in mega.said({}) and "stored in the store" in mega.said(first.written)
