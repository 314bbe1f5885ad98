"""What ``prune`` and ``verify --fix`` cannot read here is kept, and said so: an artifact
unreadable without zstandard, of a newer format, or over this node's
``PLANCACHE_COMPILE_MAX_BYTES`` (a line naming it, object name or ``KEY12/rank_R_D``, says
``kept``; for a missing zstandard the output names ``zstandard``); a raised cap is honoured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plancache.testing import child_env
from tests.kinds.helpers import (
    GIB,
    JUDGING,
    PRUNE,
    RANK,
    REF,
    ZSTD_MAGIC,
    assert_kept,
    cli,
    output,
    rewrite,
    upload,
)

# -- zstandard not importable --------------------------------------------------------------
NO_ZSTANDARD = 'raise ImportError("zstandard is not installed here (test)")\n'


@JUDGING
def test_artifact_unreadable_without_zstandard_is_kept(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    data = path.read_bytes()
    assert data[:4] == ZSTD_MAGIC  # stored compressed: this process has zstandard
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "zstandard.py").write_text(NO_ZSTANDARD)
    env = child_env(pythonpath=[shim])
    check = subprocess.run(
        [sys.executable, "-c", "import zstandard"], env=env, capture_output=True, text=True
    )
    assert check.returncode != 0 and "not installed here" in check.stderr  # the shim works
    result = cli(*command, str(root), env=env)
    assert_kept(result, path, data)
    assert "zstandard" in result.stdout + result.stderr, output(result)


# -- a newer format, and caps other than 4 GiB ---------------------------------------------
def _next_format(body: dict[str, Any]) -> None:
    field = "format" if "format" in body else "version"
    assert isinstance(body.get(field), int), body
    body[field] += 1


@JUDGING
def test_artifact_of_a_newer_format_is_kept(tmp_path: Path, command: tuple[str, ...]) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    rewrite(path, _next_format)  # a valid stream of the next, unknown, format; made now
    data = path.read_bytes()
    result = cli(*command, str(root))
    assert_kept(result, path, data)


def _declares(size: int) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        [entry] = [f for f in body["files"] if f["path"] == f"{RANK}/model"]
        entry["size"] = size

    return change


def test_prune_keeps_an_artifact_over_the_default_cap(tmp_path: Path) -> None:
    # stored by a fleet that set PLANCACHE_COMPILE_MAX_BYTES over 4 GiB; this node did not
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    rewrite(path, _declares(5 * GIB), head_only=True)  # prune reads the head only
    data = path.read_bytes()
    result = cli(*PRUNE, str(root))
    assert_kept(result, path, data)


@JUDGING
def test_artifact_over_a_lowered_cap_is_kept_and_reported(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)  # about 3 kB
    data = path.read_bytes()
    result = cli(*command, str(root), env=child_env(PLANCACHE_COMPILE_MAX_BYTES="1024"))
    assert_kept(result, path, data)


def test_commands_honour_a_raised_cap(tmp_path: Path) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    rewrite(path, _declares(5 * GIB), head_only=True)
    data = path.read_bytes()
    env = child_env(PLANCACHE_COMPILE_MAX_BYTES=str(8 * GIB))
    pruned = cli(*PRUNE, str(root), env=env)
    assert path.exists(), f"a fresh artifact under the cap was deleted:\n{output(pruned)}"
    assert path.read_bytes() == data
    assert "unreadable" not in pruned.stdout + pruned.stderr, output(pruned)
    listed = cli("ls", str(root), env=env)
    assert REF in listed.stdout and "unreadable" not in listed.stdout, output(listed)
