"""``plancache cp`` copies the version it judged, every byte checked, under this process's
cap: a co-tenant of the bucket who swaps an unsigned artifact in after the signature was
judged gets nothing copied but the signed one."""

from __future__ import annotations

import os
from pathlib import Path

from plancache._artifacts.manifest import artifact_object_name
from plancache._artifacts.packing import pack
from plancache._inventory import artifacts as inventory
from plancache._objects import Opened
from plancache._signing import Keyring
from plancache.testing import LocalLayer as LocalStore
from plancache.testing import child_env
from tests.artifacts.helpers import KEY, RANK, make_tree
from tests.cli.helpers import run

SIGNING = "s" * 40
NAME = artifact_object_name(KEY, RANK)


def _artifact(tmp_path: Path, keyring: Keyring, model: bytes) -> bytes:
    root = make_tree(tmp_path / f"tree-{model[:4].hex()}", model=model)
    _, chunks = pack(root, KEY, RANK, keyring=keyring)
    return b"".join(chunks)


class RacingStore(LocalStore):
    """A local store where a co-tenant replaces ``NAME`` right after each time it is opened
    (a new file renamed into place, as any writer of the store does)."""

    swap: bytes = b""

    def open_object(self, name: str) -> Opened | None:
        opened = super().open_object(name)
        if name == NAME and self.swap:
            temp = self.root / ".swap"
            temp.write_bytes(self.swap)
            os.replace(temp, self.root / NAME)
        return opened


def test_cp_copies_the_version_it_judged(tmp_path: Path) -> None:
    signed = _artifact(tmp_path, Keyring(SIGNING), b"SIGNED-MODEL" * 10)
    unsigned = _artifact(tmp_path, Keyring(), b"EVIL-MODEL" * 10)
    source = RacingStore(tmp_path / "src")
    assert source.write_object(NAME, [signed])
    source.swap = unsigned
    target = LocalStore(tmp_path / "dst")
    done = inventory.copy(source, target, NAME, keyring=Keyring(None, [SIGNING]))
    assert done is True
    found = target.read_object(NAME, 1 << 30)
    assert found is not None and found[0] == signed  # never the object swapped in


def test_cp_reads_the_cap_from_the_settings(tmp_path: Path) -> None:
    """``ls`` and ``cp`` read ``PLANCACHE_COMPILE_MAX_BYTES`` alike (``cp`` used the default
    4 GiB: a raised cap listed an artifact that ``cp`` skipped)."""
    signed = _artifact(tmp_path, Keyring(SIGNING), b"M" * 20_000)
    assert LocalStore(tmp_path / "src").write_object(NAME, [signed])
    keys = {"PLANCACHE_VERIFY_KEYS": SIGNING}
    small = child_env(PLANCACHE_COMPILE_MAX_BYTES="10000", **keys)
    result = run("cp", str(tmp_path / "src"), str(tmp_path / "small"), env=small)
    assert result.returncode == 0, result.stderr
    assert "skipped compile artifact" in result.stdout and "10000" in result.stdout
    assert LocalStore(tmp_path / "small").read_object(NAME, 1) is None
    result = run("cp", str(tmp_path / "src"), str(tmp_path / "big"), env=child_env(**keys))
    assert result.returncode == 0, result.stderr
    assert LocalStore(tmp_path / "big").read_object(NAME, 1) is not None
