"""Packing, verifying and installing compile artifacts, on synthetic AOT directories (no vLLM).

Every refusal leaves the target as it was: no rank directory, no kernel, no temp directory.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import orjson
import pytest

from plancache._artifacts import archive, packing
from plancache._artifacts.archive import ArtifactError, install
from plancache._artifacts.manifest import (
    MANIFEST_NAME,
    Manifest,
    artifact_object_name,
    parse_artifact_object_name,
)
from plancache._artifacts.packing import pack
from plancache._signing import Keyring, SignatureVerdict
from tests.artifacts.helpers import KEY, RANK, make_tree, stream

K1, K2 = "k1-" + "a" * 30, "k2-" + "b" * 30


def accept_all(m: Manifest) -> None:
    return None


def untouched(target: Path) -> bool:
    """Nothing installed under ``target`` (vLLM's ``<key>`` directory)."""
    return not target.exists() or not any(target.iterdir())


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_installs_every_byte_and_mode(tmp_path: Path, compress: bool) -> None:
    if compress:
        pytest.importorskip("zstandard")
    src = make_tree(tmp_path / "a" / KEY)
    manifest, chunks = pack(src, KEY, RANK, compress=compress, labels={"model": "tiny"})
    data = b"".join(chunks)
    assert data.startswith(archive.ZSTD_MAGIC) == compress
    target = tmp_path / "b" / KEY
    installed = install(io.BytesIO(data), target, KEY, RANK, accept=accept_all)
    assert installed == manifest and manifest.labels == {"model": "tiny"}
    for entry in manifest.files:
        got = target / entry.path
        assert got.read_bytes() == (src / entry.path).read_bytes()
        assert stat.S_IMODE(got.stat().st_mode) == entry.mode
    assert stat.S_IMODE((target / "inductor_cache/ab/k.so").stat().st_mode) == 0o755
    assert not [p for p in target.iterdir() if p.name.startswith(".plancache")]


def test_vllm_temp_files_and_links_are_not_packed(tmp_path: Path) -> None:
    src = make_tree(tmp_path / KEY)
    (src / RANK / "model.123.tmp").write_bytes(b"half")
    os.symlink("/etc/passwd", src / "inductor_cache" / "ab" / "link")
    manifest, _ = pack(src, KEY, RANK)
    paths = {e.path for e in manifest.files}
    assert f"{RANK}/model.123.tmp" not in paths and "inductor_cache/ab/link" not in paths


def test_present_rank_directory_is_kept(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    target = make_tree(tmp_path / "b" / KEY, model=b"vLLM's own")
    assert install(stream(src), target, KEY, RANK, accept=accept_all) is None
    assert (target / RANK / "model").read_bytes() == b"vLLM's own"


def test_tampered_byte_is_never_installed(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    data = bytearray(stream(src, compress=False).read())
    data[data.index(b"MODEL-BYTES") + 3] ^= 1
    target = tmp_path / "b" / KEY
    with pytest.raises(ArtifactError, match="tampered"):
        install(io.BytesIO(bytes(data)), target, KEY, RANK, accept=accept_all)
    assert untouched(target)


@pytest.mark.parametrize("cut", [10, 700, -1100, -1])
def test_truncated_stream_is_never_installed(tmp_path: Path, cut: int) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    data = stream(src, compress=False).read()
    target = tmp_path / "b" / KEY
    with pytest.raises(ArtifactError):
        install(io.BytesIO(data[:cut]), target, KEY, RANK, accept=accept_all)
    assert untouched(target)


def test_foreign_artifact_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    target = tmp_path / "b" / ("c" * 64)
    with pytest.raises(ArtifactError, match="foreign"):
        install(stream(src), target, "c" * 64, RANK, accept=accept_all)
    with pytest.raises(ArtifactError, match="foreign"):
        install(stream(src), tmp_path / "c" / KEY, KEY, "rank_1_0", accept=accept_all)
    assert untouched(target)


def test_signature_covers_every_byte(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    manifest, _ = pack(src, KEY, RANK, keyring=Keyring(K1))
    assert manifest.verdict(Keyring(verify_keys=[K1])) is SignatureVerdict.VALID
    assert manifest.verdict(Keyring(verify_keys=[K2])) is SignatureVerdict.UNKNOWN_KEY
    first = manifest.files[0]
    changed = Manifest(
        KEY,
        RANK,
        (type(first)(first.path, first.size, "0" * 64, first.mode), *manifest.files[1:]),
        manifest.created_at,
        signature=manifest.signature,
    )
    assert changed.verdict(Keyring(verify_keys=[K1])) is SignatureVerdict.BAD_MAC


def test_refusal_by_accept_installs_nothing(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    target = tmp_path / "b" / KEY
    with pytest.raises(ArtifactError, match="refused: nope"):
        install(stream(src), target, KEY, RANK, accept=lambda m: "nope")
    assert untouched(target)


# -- hostile archives --------------------------------------------------------------------------
def _archive(
    manifest: dict[str, object], members: list[tarfile.TarInfo | tuple[str, bytes]]
) -> bytes:
    """A ustar archive: the manifest, then ``members`` (a TarInfo alone, or name and bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        data = orjson.dumps(manifest)
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return buf.getvalue()


def _manifest(files: list[dict[str, object]]) -> dict[str, object]:
    model = {"path": f"{RANK}/model", "size": 1, "sha256": "0" * 64, "mode": 0o644}
    return {
        "format": 1,
        "key": KEY,
        "rank": RANK,
        "files": [*files, model],
        "created_at": 1.0,
        "producer": {},
        "labels": {},
    }


def _entry(path: str, mode: int = 0o644, size: int = 1) -> dict[str, object]:
    return {"path": path, "size": size, "sha256": "0" * 64, "mode": mode}


@pytest.mark.parametrize(
    "files",
    [
        [_entry("../escape")],
        [_entry("inductor_cache/../../escape")],
        [_entry("/etc/passwd")],
        [_entry("elsewhere/file")],
        [_entry("inductor_cache/./x")],
        [_entry("inductor_cache/x", mode=0o4755)],
        [_entry("inductor_cache/x", mode=0o2755)],
        [_entry("inductor_cache/x", mode=0o777)],
        [_entry("inductor_cache/x"), _entry("inductor_cache/x")],
        [_entry("inductor_cache/x"), _entry("inductor_cache/x/y")],
        [_entry("inductor_cache/x", size=-1)],
    ],
    ids=[
        "dotdot",
        "nested-dotdot",
        "absolute",
        "outside-dirs",
        "dot",
        "setuid",
        "setgid",
        "world-writable",
        "twice",
        "file-and-dir",
        "negative-size",
    ],
)
def test_unsafe_manifest_is_refused(tmp_path: Path, files: list[dict[str, object]]) -> None:
    data = _archive(_manifest(files), [])
    with pytest.raises(ArtifactError, match="manifest is invalid"):
        install(io.BytesIO(data), tmp_path / KEY, KEY, RANK, accept=accept_all)
    assert untouched(tmp_path / KEY) and not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.DIRTYPE]
)
def test_links_devices_and_directories_are_refused(tmp_path: Path, kind: bytes) -> None:
    member = tarfile.TarInfo("inductor_cache/x")
    member.type, member.linkname = kind, "/etc/passwd"
    data = _archive(_manifest([_entry("inductor_cache/x")]), [member])
    with pytest.raises(ArtifactError, match="not a regular file"):
        install(io.BytesIO(data), tmp_path / KEY, KEY, RANK, accept=accept_all)
    assert untouched(tmp_path / KEY)


def test_member_not_in_manifest_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    manifest, _ = pack(src, KEY, RANK)
    data = _archive(orjson.loads(manifest.encode()), [("inductor_cache/evil", b"x")])
    with pytest.raises(ArtifactError, match="next file"):
        install(io.BytesIO(data), tmp_path / "b" / KEY, KEY, RANK, accept=accept_all)
    assert untouched(tmp_path / "b" / KEY)


def test_extra_member_after_the_last_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    _, chunks = pack(src, KEY, RANK, compress=False)
    body = b"".join(chunks)[: -2 * packing.BLOCK]  # without the end-of-archive blocks
    extra = tarfile.TarInfo("inductor_cache/extra")
    extra.size = 1
    data = body + extra.tobuf(tarfile.USTAR_FORMAT) + b"x".ljust(512, b"\0") + b"\0" * 1024
    with pytest.raises(ArtifactError, match="more than its manifest"):
        install(io.BytesIO(data), tmp_path / "b" / KEY, KEY, RANK, accept=accept_all)
    assert untouched(tmp_path / "b" / KEY)


def test_size_and_file_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    with pytest.raises(ArtifactError, match="caps"):
        pack(src, KEY, RANK, max_bytes=100)
    data = stream(src).read()
    with pytest.raises(ArtifactError, match="over 100"):
        install(io.BytesIO(data), tmp_path / "b" / KEY, KEY, RANK, accept=accept_all, max_bytes=100)
    monkeypatch.setattr(packing, "MAX_FILES", 2)
    with pytest.raises(ArtifactError, match="caps"):
        pack(src, KEY, RANK)
    assert untouched(tmp_path / "b" / KEY)


def test_object_names() -> None:
    name = artifact_object_name(KEY, RANK)
    assert name == f"compile_artifact_{KEY}_{RANK}.tar"
    assert parse_artifact_object_name(name) == (KEY, RANK)
    assert parse_artifact_object_name(f"startup_plan_{KEY}.json") is None
    assert parse_artifact_object_name(f"compile_artifact_{KEY}_rank_x_0.tar") is None
