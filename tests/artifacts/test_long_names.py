"""Nothing left out silently (issue 34, item 2): a bundle carries every name the file system
allows (components up to 255 bytes, deep trees, every character Triton and Inductor use),
old-format readers' archives still read, and whatever is still left out (a name no bundle
may hold, another user's file, a cap) is counted in the upload's log line and its metric."""

from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from plancache._artifacts import archive, packing
from plancache._artifacts.manifest import MAX_PATH_CHARS, check_path
from plancache.caches import CacheShare, directory_cache
from plancache.errors import ArtifactError, InvalidPlanError

# the fused kernel an H200 run left out of its bundle: 153 characters with ``.cubin``
FUSED = (
    "triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_arange_"
    "cos_mul_sin_slice_stack_sub_transpose_unbind_unsqueeze_view_1"
)
KEY = "GXKXTD2QM3TQX5E7QKJ6IYM4Z5QJ4SS6ONJVZ6A3TQ2DWBUQ5V3Q"  # Triton's base32 key
FACTORS = {"triton": "3.6.0", "device": "NVIDIA H200 sm_90"}


def _triton_kernel(root: Path, name: str) -> dict[str, bytes]:
    """Triton's file layout for kernel ``name`` (``<key>/<name>.*`` and its group file,
    which names the producer's absolute paths); {relative path: bytes}."""
    d = root / KEY
    d.mkdir(parents=True, exist_ok=True)
    files = {
        f"{name}.cubin": b"\x7fELF" + os.urandom(64),
        f"{name}.ptx": b"//ptx " + name.encode(),
        f"{name}.json": orjson.dumps({"name": name, "num_warps": 4}),
        f"{name}.ttir": b"module {}",
    }
    for base, data in files.items():
        (d / base).write_bytes(data)
    group = {"child_paths": {base: str(d / base) for base in files}}
    files[f"__grp__{name}.json"] = orjson.dumps(group)
    (d / f"__grp__{name}.json").write_bytes(files[f"__grp__{name}.json"])
    return {f"{KEY}/{base}": data for base, data in files.items()}


def _share(tmp_path: Path) -> CacheShare:
    return CacheShare.from_env(
        {"PLANCACHE_URL": str(tmp_path / "store"), "PLANCACHE_LOCAL_TIER": "0"}
    )


def test_the_long_named_fused_kernel_travels_with_triton_s_layout(tmp_path: Path) -> None:
    producer, consumer = tmp_path / "producer" / "triton", tmp_path / "elsewhere" / "cache"
    expected = _triton_kernel(producer, FUSED)
    expected |= _triton_kernel(producer, "x" * 243)  # its group file: a 255-byte component
    assert max(len(p.rsplit("/", 1)[1]) for p in expected) == 255
    deep = "/".join(["d" * 40] * 20) + "/" + "f" * 200  # 1,019 characters, 21 levels
    assert len(deep) <= MAX_PATH_CHARS
    (producer / deep).parent.mkdir(parents=True)
    (producer / deep).write_bytes(b"deep")
    expected[deep] = b"deep"
    odd = "a_b.c+d=e@f,g~h-i"  # every character Triton and Inductor names use
    (producer / odd).write_bytes(b"odd")
    expected[odd] = b"odd"
    with _share(tmp_path) as share:
        pushed = share.push(directory_cache("triton", producer, FACTORS))
        assert pushed.files == len(expected)
        pulled = share.pull(directory_cache("triton", consumer, FACTORS))
    assert pulled.reason == "hit", pulled
    got = {str(p.relative_to(consumer)): p.read_bytes() for p in consumer.rglob("*") if p.is_file()}
    assert got.keys() == expected.keys()
    for rel, data in expected.items():
        if "/__grp__" not in rel:
            assert got[rel] == data, rel
            continue
        children = orjson.loads(got[rel])["child_paths"]  # re-rooted where this node keeps them
        assert children == {b: str(consumer / KEY / b) for b in orjson.loads(data)["child_paths"]}


def _left_out(why: str) -> float:
    """``plancache_left_out_total`` of ``triton`` uploads for ``why``, in this process."""
    found = REGISTRY.get_sample_value("plancache_left_out_total", {"kind": "triton", "why": why})
    return found or 0.0


def test_what_is_left_out_is_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    kept = _triton_kernel(root, FUSED)
    (root / "with space.bin").write_bytes(b"x")  # a name no bundle may hold
    (root / "ünïcode.bin").write_bytes(b"x")
    (root / "link.bin").symlink_to(root / KEY / f"{FUSED}.ptx")
    foreign = root / "theirs.bin"
    foreign.write_bytes(b"x")
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
    else:
        foreign.chmod(0o666)  # writable by all: left out the same way
    caplog.set_level(logging.INFO, logger="plancache")
    before = {why: _left_out(why) for why in ("foreign", "odd", "name", "cap")}
    with _share(tmp_path) as share:
        pushed = share.push(directory_cache("triton", root, FACTORS))
    assert pushed.files == len(kept)
    counted = {why: _left_out(why) - n for why, n in before.items()}
    assert counted == {"foreign": 1, "odd": 1, "name": 2, "cap": 0}
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "4 files left out" in lines[0], lines[0]
    assert "2 named as no bundle may name a file" in lines[0], lines[0]
    assert "1 not a regular file" in lines[0] and "1 another user could have written" in lines[0]


def test_a_cap_reached_is_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cache"
    for i in range(5):
        (root / f"k{i}").mkdir(parents=True)
        (root / f"k{i}" / "f.bin").write_bytes(b"x" * 100)
    caplog.set_level(logging.INFO, logger="plancache")
    entries = packing.scan_cache(root, max_bytes=250)
    assert len(entries) == 2
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1 and "3 past the bundle's cap" in lines[0], lines


def test_names_past_the_limits_are_refused() -> None:
    assert check_path("a" * 255, "") == "a" * 255
    for bad in ("a" * 256, "/".join(["d" * 40] * 30), "a b", "ü", ".hidden", "a/../b"):
        with pytest.raises(InvalidPlanError):
            check_path(bad, "")


def _pax_member(headers: dict[str, str], data: bytes = b"x") -> bytes:
    info = tarfile.TarInfo("short")
    info.size, info.mode = len(data), 0o644
    info.pax_headers = headers
    buf = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
    return buf + data + b"\0" * (-len(data) % 512)


@pytest.mark.parametrize(
    "headers",
    [
        {"path": "a/b", "uid": "0"},  # anything but the path: refused
        {"path": "x" * 300},  # a component past 255 bytes
        {"linkpath": "/etc/passwd"},
    ],
)
def test_an_extended_header_holds_a_path_and_nothing_else(headers: dict[str, str]) -> None:
    with pytest.raises(ArtifactError, match="extended header"):
        archive._member(archive._Stream(io.BytesIO(_pax_member(headers))))


def test_an_extended_header_names_the_member_that_follows() -> None:
    name = f"{KEY}/{FUSED}.cubin"
    info = archive._member(archive._Stream(io.BytesIO(_pax_member({"path": name}))))
    assert info.name == name and info.size == 1
