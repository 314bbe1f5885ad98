"""The generated caches beyond the compile artifact, shared between fresh processes: Triton's
cache (real kernels compiled for a CUDA target by Triton 3.9 on this CPU) and what a load and
warm-up add to a compile artifact's ``inductor_cache/`` (real vLLM 0.33 on CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plancache import open_store
from plancache.testing import child_env
from tests.vllm import support
from tests.vllm.support import HERE, MODEL_CONFIG, REPO, vllm_installed

AOT = Path("torch_compile_cache") / "torch_aot_compile"
pytestmark = [
    pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (tox -e vllm)"),
    pytest.mark.timeout(900),
]


def _run(script: str, root: Path, store: Path, *args: str) -> tuple[dict[str, Any], str]:
    env = child_env(
        [REPO],
        PLANCACHE_URL=str(store),
        VLLM_CACHE_ROOT=str(root),
        TRITON_CACHE_DIR=str(root / "triton"),
        TRITON_DEFAULT_FP_FUSION="1",
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    proc = subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    [(code, report, log)] = list(support.outcomes(proc, timeout=400))
    assert code == 0, log[-4000:]
    return report, log


def test_a_new_node_compiles_no_triton_kernel_a_warm_node_would_not(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    store = tmp_path / "store"
    cold, _ = _run("triton_node.py", tmp_path / "cold", store, "--kernels", "3")
    assert cold["compiled"] == 3
    warm, _ = _run("triton_node.py", tmp_path / "cold", store, "--kernels", "3")
    assert warm["compiled"] == 0
    bundles = list(open_store(str(store)).layer.list_objects("cache_triton_"))
    assert len(bundles) == 1  # the warm node added nothing: nothing written
    new, log = _run("triton_node.py", tmp_path / "new", store, "--kernels", "4")
    assert new["compiled"] == 1, log[-3000:]  # the three shared load; the fourth is new
    assert "triton cache: hit, 1 bundles" in log
    assert len(list(open_store(str(store)).layer.list_objects("cache_triton_"))) == 2  # its delta
    assert "triton cache: 1 kernels compiled although 1 bundles were installed" in log
    third, log = _run("triton_node.py", tmp_path / "third", store, "--kernels", "4")
    assert third["compiled"] == 0, log[-3000:]
    assert "compiled although" not in log  # every kernel it used was shared
    stats = subprocess.run(
        [sys.executable, "-m", "plancache", "stats", "--json", str(store)],
        env=child_env([REPO]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    booted = json.loads(stats.stdout)["boot_reports"]
    assert booted["stored"] == booted["read"] == 4, stats.stderr  # one per node's boot
    triton = booted["kinds"]["cache_triton"]
    assert (triton["boots"], triton["rebuilt"], triton["boots_rebuilt"]) == (4, 1, 1)
    assert triton["results"] == {"miss": 1, "hit": 3}
    # a node whose directory holds a kernel from an earlier boot that no bundle holds: it
    # compiles nothing, and that kernel is not reported as rebuilt (it uploads it)
    _run("triton_node.py", tmp_path / "earlier", tmp_path / "other-store", "--kernels", "5")
    shutil.copytree(tmp_path / "earlier" / "triton", tmp_path / "restarted" / "triton")
    restarted, log = _run("triton_node.py", tmp_path / "restarted", store, "--kernels", "5")
    assert restarted["compiled"] == 0, log[-3000:]
    assert "compiled although" not in log, log[-3000:]
    assert "new files stored" in log, log[-3000:]


def test_what_a_load_and_warm_up_add_to_inductor_cache_reaches_new_nodes(
    tmp_path: Path,
) -> None:
    """After the cold node saved and uploaded its artifact, its ``inductor_cache/`` grows:
    vLLM's own load and warm-up add kernels at times (not on every CPU run), and a file is
    planted there too (one more kernel, so that the test never depends on that). The warm
    boot stores exactly what was added, as one bundle, and a new node installs it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    store = tmp_path / "store"
    args = ("--model-dir", str(model), "--wait-upload", "120", "--sizes", "16")
    cold, log = _run("compile_node.py", tmp_path / "cold", store, *args)
    assert cold["aot_compiles"] == 1, log[-3000:]
    [key] = list((tmp_path / "cold" / AOT).iterdir())
    planted = key / "inductor_cache" / "zz" / "czzwarmupkernel.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("# a kernel the warm-up compiled\n")
    warm, log = _run("compile_node.py", tmp_path / "cold", store, *args)
    assert warm["loaded_from_disk"], log[-3000:]
    added = warm["inductor_files"] - cold["inductor_files"]
    assert f"warm-up additions ({added} files) stored: store=created" in log, log[-3000:]
    new, log = _run("compile_node.py", tmp_path / "new", store, *args)
    assert new["loaded_from_disk"] and new["equal_eager"], log[-3000:]
    assert f"warm-up additions: hit, 1 bundles, {added} files installed" in log
    assert (tmp_path / "new" / AOT / key.name / "inductor_cache" / "zz" / planted.name).exists()
    extra = new["inductor_files"] - warm["inductor_files"]  # vLLM on CPU adds kernels at
    assert extra >= 0  # some loads and not at others: a new node may add its own
    if extra:
        assert f"warm-up additions ({extra} files) stored: store=created" in log, log[-3000:]
    else:
        assert "warm-up additions (" not in log  # it added nothing: nothing stored
