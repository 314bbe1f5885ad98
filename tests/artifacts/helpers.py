"""Synthetic AOT directories, shaped as vLLM 0.33 writes them (no vLLM needed), and the
artifact stores the tests open."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.packing import pack
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings
from plancache._signing import Keyring

KEY = "e" * 64
RANK = "rank_0_0"


def make_tree(root: Path, model: bytes = b"MODEL-BYTES" * 100, kernels: int = 3) -> Path:
    """``root`` (vLLM's ``<key>`` directory) holding ``RANK/model`` and some kernels."""
    (root / "inductor_cache" / "ab").mkdir(parents=True, exist_ok=True)
    for i in range(kernels):
        (root / "inductor_cache" / "ab" / f"c{i}.py").write_text(f"kernel = {i}\n")
    so = root / "inductor_cache" / "ab" / "k.so"
    so.write_bytes(os.urandom(2000))
    so.chmod(0o755)
    deep = root / "inductor_cache" / "aotautograd" / "xy"
    deep.mkdir(parents=True, exist_ok=True)
    (deep / "entry").write_bytes(b"\0" * 513)
    (root / RANK).mkdir(exist_ok=True)
    (root / RANK / "model").write_bytes(model)
    return root


def stream(root: Path, compress: bool = True) -> io.BytesIO:
    """The artifact of ``root`` for ``RANK``, in memory."""
    _, chunks = pack(root, KEY, RANK, compress=compress)
    return io.BytesIO(b"".join(chunks))


def artifact_store(url: str, keyring: Keyring | None = None, **kw: Any) -> ArtifactStore:
    """An ``ArtifactStore`` on ``url`` (``options``: storage options; ``local_tier``; the
    rest: ``CompileSettings``), each call bounded at 30 s."""
    options = kw.pop("options", {})
    settings = Settings(
        url,
        local_tier=kw.pop("local_tier", None),
        storage_options=options,
        keyring=keyring or Keyring(),
        timeout=30.0,
    )
    return ArtifactStore(settings, CompileSettings(**kw))
