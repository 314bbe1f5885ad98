"""Every test here runs with this node's default directory its own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _node_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This node's default directory (remote stores' conformance verdicts) is the test's
    own, here and in the commands' child processes."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "node"))
    monkeypatch.delenv("PLANCACHE_COMPILE_MAX_BYTES", raising=False)
    monkeypatch.delenv("PLANCACHE_COMPILE_TRUST_UNSIGNED", raising=False)
