"""The command on the model-info kind stored beside plans and compile artifacts: ls, show,
stats, verify (--fix), prune (by age), rm and cp (signed only into a local store), run for
real in subprocesses on a local store."""

from __future__ import annotations

import json
import time
from pathlib import Path

from plancache import open_store
from plancache._artifacts import modelinfo
from plancache._inventory.artifacts import MODEL_INFO, names
from plancache._signing import Keyring
from plancache.testing import child_env
from tests.cli.helpers import DAY, ok, run

K1 = "k1-" + "d" * 30
FILE = {"hash": "b" * 64, "modelinfo": {"is_text_generation_model": True}}


def _stock(root: Path) -> tuple[str, str]:
    """Two model infos: one of today signed with K1, one 40 days old unsigned."""
    store = open_store(str(root))
    fresh = modelinfo.ModelInfo("0.33.0", "m.llama", "Llama", FILE, time.time())
    old = modelinfo.ModelInfo("0.32.0", "m.llama", "Llama", FILE, time.time() - 40 * DAY)
    fresh = fresh.signed_with(Keyring(K1))
    for info in (fresh, old):
        assert store.layer.write_object(info.name, [info.encode()])
    return fresh.name, old.name


def test_ls_show_stats_list_model_info(tmp_path: Path) -> None:
    root = tmp_path / "store"
    fresh, _ = _stock(root)
    out = ok("ls", str(root))
    assert [line.split()[1] for line in out.splitlines() if line.startswith("model-info")] == [
        "m.llama.Llama",
        "m.llama.Llama",
    ]
    assert out.splitlines()[-1].startswith("2 model infos, in ")
    listed = json.loads(ok("ls", str(root), "--json"))
    assert sorted(e["vllm"] for e in listed if e["kind"] == "model-info") == ["0.32.0", "0.33.0"]
    shown = ok("show", fresh, "--url", str(root))
    assert "class        m.llama.Llama" in shown and f"source hash  {'b' * 64}" in shown
    assert json.loads(ok("stats", str(root), "--json"))["model_infos"] == 2


def test_prune_deletes_old_model_info_by_age(tmp_path: Path) -> None:
    root = tmp_path / "store"
    fresh, old = _stock(root)
    out = ok("prune", "--older-than", "30d", str(root))
    assert f"deleted {old}" in out and "deleted 1 model info older than 30d" in out
    assert names(open_store(str(root)).layer, MODEL_INFO) == [fresh]


def test_verify_fix_deletes_a_tampered_model_info_and_rm_takes_its_name(tmp_path: Path) -> None:
    root = tmp_path / "store"
    fresh, old = _stock(root)
    body = json.loads((root / old).read_bytes())
    body["file"]["hash"] = "c" * 64  # no longer the object its name says
    (root / old).write_text(json.dumps(body))
    found = run("verify", str(root))
    assert found.returncode == 1 and "2 model infos checked: 1 failed" in found.stdout
    fixed = ok("verify", "--fix", str(root))
    assert f"{old}  its envelope names another module, class or source  (deleted)" in fixed
    assert ok("rm", fresh, "--url", str(root)).strip() == f"deleted {fresh}"
    assert names(open_store(str(root)).layer, MODEL_INFO) == []


def test_cp_into_a_local_store_copies_signed_model_info_only(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    fresh, old = _stock(src)
    keyed = child_env(PLANCACHE_VERIFY_KEYS=K1)
    out = ok("cp", str(src), str(dst), env=keyed)
    assert f"skipped model info {old}: unsigned" in out
    assert "copied model infos: 1 created, 0 kept, 1 skipped" in out
    assert names(open_store(str(dst)).layer, MODEL_INFO) == [fresh]
    again = ok("cp", str(src), str(dst), "--trust-unsigned", env=keyed)
    assert "copied model infos: 1 created, 1 kept, 0 skipped" in again
