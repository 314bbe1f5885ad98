"""Cache bundles (Triton's cache, a compile artifact's warm-up additions, FlashInfer's
autotune files) on the object layer, without vLLM: a delta of what the stores lack, one
object per content, file-by-file installs that never replace a node's file and make a Triton
kernel visible only once its files are in place, the trust rule of compile artifacts, the
inventory's rules, local and S3 stores."""

from __future__ import annotations

import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from plancache._artifacts import archive, bundles, packing
from plancache._artifacts.manifest import (
    CACHE_KINDS,
    Manifest,
    cache_object_name,
    parse_cache_name,
)
from plancache._inventory import artifacts as inventory
from plancache._keys import fingerprint
from plancache._signing import Keyring
from plancache.errors import ArtifactError, InvalidPlanError, UnreadableHereError
from plancache.testing import LocalLayer as LocalStore
from plancache.testing.servers import MotoS3
from tests.artifacts.helpers import artifact_store

K1 = "k1-" + "a" * 30
SCOPE = fingerprint({"cache": "triton", "triton": "3.9.0", "device": "H100 sm_90"})


def _kernel(root: Path, key: str, name: str = "add", body: bytes = b"\x7fELF cubin") -> None:
    """A Triton cache entry as Triton 3.9 writes it (``<key>/<name>.*`` and its group)."""
    d = root / key
    d.mkdir(parents=True, exist_ok=True)
    children = {}
    for ext, data in ((".cubin", body), (".ptx", b"//ptx"), (".json", b'{"name": "add"}')):
        (d / f"{name}{ext}").write_bytes(data)
        children[f"{name}{ext}"] = str(d / f"{name}{ext}")
    (d / f"__grp__{name}.json").write_bytes(orjson.dumps({"child_paths": children}))


def test_bundle_names_carry_the_kind_the_scope_and_the_content_alone(tmp_path: Path) -> None:
    for key in ("A" * 52, "B" * 52):
        _kernel(tmp_path / "a", key)
    files_a = packing.scan_cache(tmp_path / "a")
    one, _ = packing.pack_cache(tmp_path / "a", "triton", SCOPE, files_a)
    time.sleep(0.01)
    two, _ = packing.pack_cache(tmp_path / "a", "triton", SCOPE, packing.scan_cache(tmp_path / "a"))
    assert one.name == two.name and one.created_at != two.created_at  # same files, one object
    assert parse_cache_name(one.name) == ("triton", SCOPE, one.content)
    other, _ = packing.pack_cache(tmp_path / "a", "triton", "0" * 64, files_a)
    assert other.name != one.name
    assert parse_cache_name("cache_my_jit_" + SCOPE + "_" + "0" * 32 + ".tar") == (
        "my_jit",
        SCOPE,
        "0" * 32,
    )
    for bad in ("Nope", "compile", "a-b", "x" * 33, "_x"):
        assert parse_cache_name(f"cache_{bad}_{SCOPE}_{'0' * 32}.tar") is None
        with pytest.raises(InvalidPlanError):
            cache_object_name(bad, SCOPE, "0" * 32)
    assert set(CACHE_KINDS) >= {"triton", "inductor", "flashinfer_autotune"}


def test_a_compile_artifacts_manifest_encodes_as_before() -> None:
    """Old manifests (and their signatures) stay valid: ``kind`` is written for bundles only."""
    m = Manifest("a" * 64, "rank_0_0", (), created_at=1.0)
    assert b"kind" not in m.payload()
    bundle = Manifest(SCOPE, "", (), created_at=1.0, kind="triton")
    assert b'"kind":"triton"' in bundle.payload()


def test_scan_leaves_out_temp_lock_and_known_files(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _kernel(root, "K" * 52)
    (root / "tmp.pid_12_34").mkdir()
    (root / "tmp.pid_12_34" / "add.cubin").write_bytes(b"half")
    (root / ".plancache-tmp-x").mkdir()
    (root / ".plancache-tmp-x" / "f").write_bytes(b"x")
    (root / "locks").mkdir()
    (root / "locks" / "a.lock").write_bytes(b"")
    (root / "K").mkdir()
    (root / "K" / "x.tmp").write_bytes(b"")
    (root / "K" / "bad name").write_bytes(b"")  # no bundle may hold it: left out
    os.symlink("/etc/passwd", root / "K" / "link")
    os.mkfifo(root / "K" / "fifo")
    paths = [e.path for e in packing.scan_cache(root)]
    assert paths == sorted(
        f"{'K' * 52}/{n}" for n in ("__grp__add.json", "add.cubin", "add.json", "add.ptx")
    )
    known = frozenset(paths[:2])
    assert [e.path for e in packing.scan_cache(root, known)] == paths[2:]
    assert len(packing.scan_cache(root, max_bytes=20)) < len(paths)  # the rest: a later bundle


def test_install_never_replaces_a_file_and_puts_the_group_file_last(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _kernel(src, "K" * 52)
    manifest, chunks = packing.pack_cache(src, "triton", SCOPE, packing.scan_cache(src))
    data = b"".join(chunks)
    node = tmp_path / "node"
    (node / ("K" * 52)).mkdir(parents=True)
    (node / ("K" * 52) / "add.ptx").write_bytes(b"the node's own")
    order: list[str] = []
    real_link = os.link

    def link(a: Any, b: Any, **kw: Any) -> None:
        order.append(Path(b).name)
        real_link(a, b, **kw)

    os.link = link  # type: ignore[assignment]
    try:
        got, installed = archive.install_cache(
            io.BytesIO(data), node, "triton", SCOPE, accept=lambda m: None
        )
    finally:
        os.link = real_link
    assert got.name == manifest.name and installed == 3  # add.ptx was the node's
    assert order[-1] == "__grp__add.json"
    group = orjson.loads((node / ("K" * 52) / "__grp__add.json").read_bytes())
    assert group["child_paths"] == {  # re-rooted where this node keeps the cache
        n: str(node / ("K" * 52) / n) for n in ("add.cubin", "add.ptx", "add.json")
    }
    assert (node / ("K" * 52) / "add.ptx").read_bytes() == b"the node's own"
    assert (node / ("K" * 52) / "add.cubin").read_bytes() == b"\x7fELF cubin"
    assert oct((node / ("K" * 52) / "add.cubin").stat().st_mode & 0o777) == oct(0o644)
    assert not [p for p in node.iterdir() if p.name.startswith(".")]  # temp dir removed


def test_a_group_file_triton_did_not_write_is_not_installed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _kernel(src, "K" * 52)
    (src / ("K" * 52) / "__grp__add.json").write_bytes(
        orjson.dumps({"child_paths": {"add.cubin": "/etc/add.cubin", "x": "/etc/passwd"}})
    )
    _, chunks = packing.pack_cache(src, "triton", SCOPE, packing.scan_cache(src))
    node = tmp_path / "node"
    _, installed = archive.install_cache(
        io.BytesIO(b"".join(chunks)), node, "triton", SCOPE, accept=lambda m: None
    )
    assert installed == 3 and not (node / ("K" * 52) / "__grp__add.json").exists()


def test_a_tampered_foreign_or_refused_bundle_installs_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _kernel(src, "K" * 52, body=b"C" * 4096)
    _, chunks = packing.pack_cache(src, "triton", SCOPE, packing.scan_cache(src), compress=False)
    data = b"".join(chunks)
    node = tmp_path / "node"
    tampered = data.replace(b"C" * 64, b"D" * 64, 1)
    cases: list[tuple[bytes, str, str]] = [
        (tampered, "triton", SCOPE),
        (data, "triton", "0" * 64),  # another scope's
        (data, "inductor", SCOPE),  # another kind's
        (data[: len(data) // 2], "triton", SCOPE),  # truncated
    ]
    for blob, kind, scope in cases:
        with pytest.raises(ArtifactError):
            archive.install_cache(io.BytesIO(blob), node, kind, scope, accept=lambda m: None)
    with pytest.raises(ArtifactError, match="refused: no"):
        archive.install_cache(io.BytesIO(data), node, "triton", SCOPE, accept=lambda m: "no")
    assert not any(node.rglob("*.cubin"))


def test_a_kind_outside_the_pattern_is_unreadable_here_not_corrupt() -> None:
    body = Manifest(SCOPE, "", (), created_at=1.0, kind="triton").encode()
    newer = body.replace(b'"kind":"triton"', b'"kind":"Tile-Lang"')
    with pytest.raises(UnreadableHereError):
        Manifest.decode(newer)
    # any name of the pattern is a kind: a program's own cache decodes as Triton's does
    for kind in (b"triton", b"tilelang"):
        named = body.replace(b'"kind":"triton"', b'"kind":"' + kind + b'"')
        with pytest.raises(InvalidPlanError, match="a file at least"):
            Manifest.decode(named)


def test_a_new_node_gets_every_kernel_and_uploads_only_what_it_added(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    cold = tmp_path / "cold"
    for i in range(3):
        _kernel(cold, f"{i}" * 52)
    first = artifact_store(store)
    assert first.fetch_cache("triton", SCOPE, cold).reason == "miss"
    files, outcome = first.upload_cache("triton", SCOPE, cold, frozenset())
    assert files == 12 and outcome == {"store": True}
    # the same files again (another node of the herd): the stored bundle holds them all,
    # nothing is packed or written
    assert artifact_store(store).upload_cache("triton", SCOPE, cold, frozenset()) == (0, {})

    new = tmp_path / "new"
    fetched = artifact_store(store).fetch_cache("triton", SCOPE, new)
    assert (fetched.reason, fetched.bundles, fetched.installed) == ("hit", 1, 12)
    assert sorted(p.name for p in new.iterdir()) == sorted(f"{i}" * 52 for i in range(3))
    _kernel(new, "9" * 52)  # what this node's warm-up compiled
    files, outcome = artifact_store(store).upload_cache(
        "triton", SCOPE, new, frozenset(fetched.known)
    )
    assert files == 4 and outcome == {"store": True}  # a delta, not a second copy
    third = tmp_path / "third"
    again = artifact_store(store).fetch_cache("triton", SCOPE, third)
    assert (again.bundles, again.installed) == (2, 16)
    assert artifact_store(store).fetch_cache("triton", "0" * 64, tmp_path / "gpu2").reason == "miss"


def test_a_scope_of_100_bundles_is_installed_whole_and_nothing_is_uploaded_again(
    tmp_path: Path,
) -> None:
    """A new node read the first 64 of 100 bundles in one scope, compiled what the other 36
    held and uploaded it again as a 101st bundle; now it installs all 100 and adds nothing."""
    store = str(tmp_path / "store")
    for i in range(100):
        node = tmp_path / f"node{i}"
        _kernel(node, f"{i:03d}" + "k" * 49)
        assert artifact_store(store).upload_cache("triton", SCOPE, node, frozenset())[0] == 4
    new = tmp_path / "new"
    fetched = artifact_store(store).fetch_cache("triton", SCOPE, new)
    assert (fetched.reason, fetched.bundles, fetched.installed) == ("hit", 100, 400)
    assert artifact_store(store).upload_cache("triton", SCOPE, new, frozenset(fetched.known)) == (
        0,
        {},
    )


def test_an_upload_never_repeats_a_file_a_stored_bundle_holds(tmp_path: Path) -> None:
    """A node that did not read a stored bundle (added after its fetch, or past its bound)
    compiled its kernels too: its upload holds only what no trusted bundle holds."""
    store = str(tmp_path / "store")
    for i in range(3):
        _kernel(tmp_path / "first", f"{i}" * 52)
    assert artifact_store(store).upload_cache("triton", SCOPE, tmp_path / "first", frozenset())[0]
    late = tmp_path / "late"
    for i in range(4):  # the same three kernels, and one more
        _kernel(late, f"{i}" * 52)
    files, written = artifact_store(store).upload_cache("triton", SCOPE, late, frozenset())
    assert (files, written) == (4, {"store": True})  # the fourth kernel's 4 files alone
    assert artifact_store(store).upload_cache("triton", SCOPE, late, frozenset()) == (0, {})


def test_trust_follows_compile_artifacts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "store"
    src = tmp_path / "src"
    _kernel(src, "K" * 52)
    artifact_store(str(store)).upload_cache("triton", SCOPE, src, frozenset())
    keyed = artifact_store(str(store), Keyring(verify_keys=[K1]))
    got = keyed.fetch_cache("triton", SCOPE, tmp_path / "a")
    assert got.reason == "invalid" and not (tmp_path / "a" / ("K" * 52)).exists()  # unsigned
    artifact_store(str(tmp_path / "signed"), Keyring(K1)).upload_cache(
        "triton", SCOPE, src, frozenset()
    )
    keyed = artifact_store(str(tmp_path / "signed"), Keyring(verify_keys=[K1]))
    assert keyed.fetch_cache("triton", SCOPE, tmp_path / "b").installed == 4
    store.chmod(0o777)  # others could have planted it
    with caplog.at_level(logging.WARNING, logger="plancache"):
        got = artifact_store(str(store)).fetch_cache("triton", SCOPE, tmp_path / "c")
    assert got.reason == "untrusted" and not (tmp_path / "c" / ("K" * 52)).exists()
    assert [r for r in caplog.records if str(store) in r.getMessage()]


def test_a_remote_store_is_trusted_unsigned_only_when_told(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str
) -> None:
    url, options = f"s3://{s3_bucket}/fleet", {"endpoint_url": moto_s3.endpoint, "timeout": 30.0}
    src = tmp_path / "src"
    for i in range(2):
        _kernel(src, f"{i}" * 52)
    producer = artifact_store(url, options=options, trust_unsigned=True)
    assert producer.upload_cache("triton", SCOPE, src, frozenset()) == (8, {"store": True})
    plain = artifact_store(url, options=options).fetch_cache("triton", SCOPE, tmp_path / "a")
    assert plain.reason == "untrusted" and not (tmp_path / "a").exists()
    trusting = artifact_store(url, options=options, trust_unsigned=True)
    got = trusting.fetch_cache("triton", SCOPE, tmp_path / "b")
    assert (got.reason, got.installed) == ("hit", 8)


def test_the_inventory_lists_verifies_and_prunes_bundles(tmp_path: Path) -> None:
    store = tmp_path / "store"
    src = tmp_path / "src"
    _kernel(src, "K" * 52, body=b"C" * 4096)
    artifact_store(str(store)).upload_cache("triton", SCOPE, src, frozenset())
    layer = LocalStore(str(store))
    [name] = inventory.names(layer, inventory.CACHES)
    [entry] = list(inventory.scan(layer, kind=inventory.CACHES))
    assert entry.manifest is not None and entry.manifest.kind == "triton"
    assert inventory.verify(layer, name, kind=inventory.CACHES) is None
    data = (store / name).read_bytes()
    (store / name).write_bytes(data[:-700])  # truncated
    problem = inventory.verify(layer, name, kind=inventory.CACHES)
    assert problem is not None and problem.corrupt
    (store / name).write_bytes(data)
    kept = inventory.prune(layer, 3600, kind=inventory.CACHES)
    assert kept.deleted == [] and (store / name).exists()
    gone = inventory.prune(layer, 3600, now=time.time() + 7200, kind=inventory.CACHES)
    assert gone.deleted == [name] and not (store / name).exists()


def test_flashinfer_autotune_files_as_vllm_writes_them(tmp_path: Path) -> None:
    """``<root>/<config hash>/autotune_configs_dp<d>_rank<r>.json``, written by vLLM's
    ``write_flashinfer_autotune_cache`` (temp ``.<name>.<rand>.tmp`` + rename): the temp
    file of a writer killed mid-way is never shared, each rank's file is."""
    scope = fingerprint({"cache": "flashinfer_autotune", "flashinfer": "0.6.1", "device": "x"})
    root = tmp_path / "producer" / "flashinfer_autotune_cache" / "0.6.1" / "90a"
    config = root / ("c" * 64)
    config.mkdir(parents=True)
    for rank in (0, 1):
        (config / f"autotune_configs_dp0_rank{rank}.json").write_bytes(b'{"tactics": {}}')
    (config / ".autotune_configs_dp0_rank1.json.ab12.tmp").write_bytes(b'{"tac')
    store = str(tmp_path / "store")
    assert (
        artifact_store(store).upload_cache("flashinfer_autotune", scope, root, frozenset())[0] == 2
    )
    node = tmp_path / "node" / "0.6.1" / "90a"
    (node / ("c" * 64)).mkdir(parents=True)
    (node / ("c" * 64) / "autotune_configs_dp0_rank0.json").write_bytes(b"its own")
    got = artifact_store(store).fetch_cache("flashinfer_autotune", scope, node)
    assert (got.reason, got.installed) == ("hit", 1)
    assert (node / ("c" * 64) / "autotune_configs_dp0_rank0.json").read_bytes() == b"its own"
    assert sorted(p.name for p in (node / ("c" * 64)).iterdir()) == [
        "autotune_configs_dp0_rank0.json",
        "autotune_configs_dp0_rank1.json",
    ]


def test_ls_names_a_scope_in_words_only_where_its_factors_hash_to_it() -> None:
    factors = {"triton": "3.9.0", "device": "H100 sm_90"}
    told = Manifest(SCOPE, "", (), labels=factors, kind="triton")
    assert bundles.scope_words(told) == "triton 3.9.0, device H100 sm_90"
    lying = Manifest(SCOPE, "", (), labels={**factors, "triton": "3.1.0"}, kind="triton")
    assert bundles.scope_words(lying) == SCOPE[:12]  # another producer's words are not taken
    assert bundles.scope_words(Manifest(SCOPE, "", (), kind="triton")) == SCOPE[:12]


def test_a_kernel_the_node_compiled_itself_is_the_same_not_a_difference(tmp_path: Path) -> None:
    src, node = tmp_path / "src", tmp_path / "node"
    _kernel(src, "K" * 52)
    _, chunks = packing.pack_cache(src, "triton", SCOPE, packing.scan_cache(src))
    _kernel(node, "K" * 52)  # Triton spaces its JSON apart; regroup does not
    group = node / ("K" * 52) / "__grp__add.json"
    group.write_text(json.dumps(orjson.loads(group.read_bytes())))
    (node / ("K" * 52) / "add.ptx").write_bytes(b"other bytes")
    placed: dict[str, str] = {}
    archive.install_cache(
        io.BytesIO(b"".join(chunks)),
        node,
        "triton",
        SCOPE,
        accept=lambda m: None,
        placed=lambda entry, outcome: placed.__setitem__(entry.path.rpartition("/")[2], outcome),
    )
    assert placed == {
        "add.cubin": "same",
        "add.json": "same",
        "__grp__add.json": "same",
        "add.ptx": "differing",
    }
