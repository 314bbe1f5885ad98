"""What the tests of every kind's commands share: synthetic AOT directories, artifacts
uploaded to a local store and changed as bytes in its directory (the documented stream: a
ustar archive, zstd-compressed or not, whose first member is the JSON manifest), and the
``plancache`` command in a subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings, keyring_from_env
from plancache.testing import child_env

KEY = "c" * 64
OTHER_KEY = "d" * 64
RANK = "rank_0_0"
REF = f"{KEY[:12]}/{RANK}"
K1 = "k1-" + "f" * 30
DAY = 86400.0
GIB = 1 << 30
BLOCK = 512
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def make_tree(root: Path, model: bytes = b"MODEL-BYTES" * 100) -> Path:
    """``root`` (vLLM's ``<key>`` directory) holding ``RANK/model`` and a few kernels."""
    kernels = root / "inductor_cache" / "ab"
    kernels.mkdir(parents=True, exist_ok=True)
    (kernels / "c0.py").write_text("kernel = 0\n")
    so = kernels / "k.so"
    so.write_bytes(os.urandom(2000))
    so.chmod(0o755)
    (root / RANK).mkdir(exist_ok=True)
    (root / RANK / "model").write_bytes(model)
    return root


def artifacts(
    url: str,
    *,
    local_tier: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    signing_key: str | None = None,
    **compile: Any,
) -> ArtifactStore:
    """The artifacts' side of the store ``url`` (no keys unless ``signing_key``)."""
    keys = {"PLANCACHE_SIGNING_KEY": signing_key} if signing_key else {}
    settings = Settings(
        url,
        local_tier=local_tier,
        storage_options=dict(storage_options or {}),
        keyring=keyring_from_env(keys),
    )
    return ArtifactStore(settings, CompileSettings(**compile))


def upload(root: Path, tmp_path: Path, key: str = KEY, model: bytes = b"") -> Path:
    """Store an unsigned artifact of ``key`` in the local store at ``root``; its file."""
    tree = make_tree(tmp_path / f"tree-{os.urandom(4).hex()}" / key, model or os.urandom(1100))
    store = artifacts(str(root))
    try:
        assert store.upload(tree, key, RANK) == {"store": True}
    finally:
        store.close()
    return stored(root, key)


def stored(root: Path, key: str = KEY) -> Path:
    """The one artifact object of ``key`` in the local store directory ``root``."""
    [path] = [p for p in root.iterdir() if key in p.name and not p.name.startswith(".")]
    return path


def plain(data: bytes) -> bytes:
    """An artifact stream without its zstd compression (if it has one)."""
    if data[:4] != ZSTD_MAGIC:
        return data
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data))
    parts = []
    while chunk := reader.read(1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def members(stream: bytes) -> list[tuple[str, bytes, int]]:
    """(name, content, mode) of every member of an uncompressed artifact stream."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:
        for info in tar:
            f = tar.extractfile(info)
            out.append((info.name, f.read() if f is not None else b"", info.mode))
    return out


def archive(items: list[tuple[str, bytes, int]]) -> bytes:
    """The ustar stream of ``items`` as plancache writes one (no record padding)."""
    parts = []
    for name, data, mode in items:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime, info.type = len(data), mode, 0, tarfile.REGTYPE
        parts += [info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"), data]
        parts.append(b"\0" * (-len(data) % BLOCK))
    parts.append(b"\0" * (2 * BLOCK))
    return b"".join(parts)


def rewrite(
    path: Path,
    manifest: Callable[[dict[str, Any]], None] | None = None,
    files: Callable[[str, bytes], bytes] | None = None,
    *,
    head_only: bool = False,
) -> None:
    """Rewrite the (unsigned) artifact at ``path``, uncompressed: its manifest changed by
    ``manifest``, each file's content by ``files`` (same length: the manifest still lists
    it), or only the manifest kept (``head_only``: the stream ends after it)."""
    [(name, data, mode), *rest] = members(plain(path.read_bytes()))
    body = json.loads(data)
    if manifest is not None:
        manifest(body)
    items = [(name, json.dumps(body, sort_keys=True).encode(), mode)]
    if not head_only:
        items += [(n, files(n, d) if files else d, m) for n, d, m in rest]
    path.write_bytes(archive(items))


def cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m plancache ARGS`` (this checkout's plancache); never raises on exit codes."""
    return subprocess.run(
        [sys.executable, "-m", "plancache", *args],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else child_env(),
        timeout=timeout,
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"[exit {result.returncode}]\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def assert_kept(result: subprocess.CompletedProcess[str], path: Path, data: bytes) -> None:
    """The artifact at ``path`` is still there as it was, and the command said it kept it."""
    assert path.exists(), f"{path.name} was deleted:\n{output(result)}"
    assert path.read_bytes() == data
    assert "Traceback" not in result.stderr, output(result)
    said = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if (path.name in line or REF in line) and "kept" in line
    ]
    assert said, f"no line says {path.name} was kept:\n{output(result)}"


PRUNE = ("prune", "--older-than", "30d")
VERIFY_FIX = ("verify", "--fix")
JUDGING = pytest.mark.parametrize("command", [PRUNE, VERIFY_FIX], ids=["prune", "verify-fix"])
