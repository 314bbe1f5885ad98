"""The command on compile artifacts stored beside plans: ls, show, verify (every byte), rm,
prune, cp and stats, on a local store and S3 (moto), run for real in subprocesses."""

from __future__ import annotations

import json
import time
from pathlib import Path

from plancache import open_store
from plancache._artifacts.manifest import artifact_object_name
from plancache._artifacts.packing import pack
from plancache._inventory.artifacts import names as artifact_names
from plancache._signing import Keyring
from plancache.testing import child_env
from tests.artifacts.helpers import KEY, make_tree
from tests.cli.helpers import DAY, LocalFixture, RemoteSpec, ok, run

K1 = "k1-" + "d" * 30


def _store_artifacts(root: Path, tmp_path: Path) -> list[str]:
    """Two artifacts beside the fixture's plans: rank 0 (signed, today), rank 1 (40 days)."""
    tree = make_tree(tmp_path / "tree" / KEY)
    (tree / "rank_1_0").mkdir()
    (tree / "rank_1_0" / "model").write_bytes(b"rank one")
    blobs = open_store(str(root))
    names = []
    for rank, keyring, created in (
        ("rank_0_0", Keyring(K1), None),
        ("rank_1_0", Keyring(), time.time() - 40 * DAY),
    ):
        manifest, chunks = pack(
            tree, KEY, rank, keyring=keyring, labels={"model": "tiny"}, created_at=created
        )
        assert blobs.layer.write_object(manifest.name, chunks)
        names.append(manifest.name)
    return names


def test_ls_show_stats(tmp_path: Path, store: LocalFixture) -> None:
    root, _, _ = store
    _store_artifacts(root, tmp_path)
    out = ok("ls", str(root))
    rows = [line.split() for line in out.splitlines() if line.startswith("compile ")]
    assert [r[1] for r in rows] == [f"{KEY[:12]}/rank_0_0", f"{KEY[:12]}/rank_1_0"]
    assert all(r[2] == "tiny" for r in rows)
    assert "KIND" in out and "FILES" in out and "SIGNED" in out
    assert "3 plans, 1 invalid, 2 compile artifacts" in out
    listed = json.loads(ok("ls", "--json", str(root)))
    kinds = [e for e in listed if e.get("kind") == "compile"]
    assert [k["rank"] for k in kinds] == ["rank_0_0", "rank_1_0"] and kinds[0]["files"] == 6
    shown = ok("show", f"{KEY[:8]}/rank_0_0", "--url", str(root))
    assert f"key          {KEY}" in shown and "rank_0_0/model" in shown
    assert "compile  2 artifacts" in ok("stats", str(root))


def test_verify_reads_every_byte_and_fix_deletes(tmp_path: Path, store: LocalFixture) -> None:
    root, _, _ = store
    names = _store_artifacts(root, tmp_path)
    assert "2 compile artifacts checked, every byte: 0 failed" in run("verify", str(root)).stdout
    signed = run("verify", "--require-signature", "--keys-file", _keys(tmp_path), str(root))
    assert "every byte: 1 failed" in signed.stdout  # rank 1 is not signed by K1
    assert f"{names[1]}  artifact refused: invalid:signature (unsigned)" in signed.stdout
    path = root / names[1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # past the manifest: only a full read finds it
    path.write_bytes(bytes(data))
    result = run("verify", str(root))
    assert result.returncode == 1 and f"{names[1]}  " in result.stdout
    assert "every byte: 1 failed" in result.stdout
    fixed = run("verify", "--fix", str(root))
    assert fixed.returncode == 0 and "(deleted)" in fixed.stdout
    assert artifact_names(open_store(str(root)).layer) == [names[0]]


def test_rm_and_prune(tmp_path: Path, store: LocalFixture) -> None:
    root, plans, _ = store
    names = _store_artifacts(root, tmp_path)
    assert f"would delete {names[1]}" in ok("prune", "--dry-run", "--older-than", "30d", str(root))
    assert artifact_names(open_store(str(root)).layer) == names
    pruned = ok("prune", "--older-than", "30d", str(root))
    assert "deleted 1 compile artifact older than 30d" in pruned
    assert artifact_names(open_store(str(root)).layer) == [names[0]]
    out = ok("rm", f"{KEY[:6]}/rank_0_0", plans[0].fingerprint, "--url", str(root))
    assert f"deleted {names[0]}" in out and f"deleted {plans[0].fingerprint}" in out
    assert artifact_names(open_store(str(root)).layer) == []
    assert run("rm", f"{KEY[:6]}/rank_0_0", "--url", str(root)).returncode == 2


def test_cp_streams_artifacts_to_s3(
    tmp_path: Path, store: LocalFixture, s3_spec: RemoteSpec
) -> None:
    root, _, _ = store
    names = _store_artifacts(root, tmp_path)
    url, options = s3_spec
    env = child_env()
    out = ok("cp", str(root), url, "--storage-options", json.dumps(options), env=env)
    assert "copied compile artifacts: 2 created, 0 kept" in out
    again = ok("cp", str(root), url, "--storage-options", json.dumps(options), env=env)
    assert "copied compile artifacts: 0 created, 2 kept" in again
    assert artifact_names(open_store(url, **options).layer) == names
    listed = ok("ls", url, "--storage-options", json.dumps(options), env=env)
    assert f"{KEY[:12]}/rank_1_0" in listed
    assert artifact_object_name(KEY, "rank_0_0") in names


def _keys(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(K1 + "\n")
    return str(path)
