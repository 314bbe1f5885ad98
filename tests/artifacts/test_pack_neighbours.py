"""Packing a cache or an artifact for upload takes only this user's files, opened as the
walk found them: a directory swapped for a link mid-walk never lets another file in (the
node's signing key, say), and another user's files are left out, counted and logged."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plancache._artifacts.packing import pack, pack_cache, scan_cache
from plancache._signing import Keyring
from plancache.errors import ArtifactError

SECRET = b"plancache-signing-key-" + b"k" * 40
KEY = "k" * 40
SECRET_SHA256 = hashlib.sha256(SECRET).hexdigest()
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> None:
    """Swap the entries ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``)."""
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _stream(chunks: object) -> bytes:
    out = []
    try:
        for chunk in chunks:  # type: ignore[attr-defined]
            out.append(chunk)
    except (ArtifactError, OSError):  # a swap caught mid-stream: the upload is abandoned
        return b""
    return b"".join(out)


SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
while True:
    libc.renameat2(-100, a, -100, b, 2)
"""


def test_a_directory_swapped_for_a_link_never_packs_the_key(tmp_path: Path) -> None:
    """Another process swaps a cache directory and a link to the key's directory
    (``renameat2(RENAME_EXCHANGE)``) in a loop while the node packs its cache: the key got
    into a validly signed bundle within 29-751 uploads before (here, its name and digest into
    about one manifest in 16); now 2,000 uploads (or 60 s) never list or hold it."""
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "00key").write_bytes(SECRET)
    cache = tmp_path / "cache"
    (cache / "kernel").mkdir(parents=True)
    (cache / "kernel" / "00key").write_bytes(b"x" * len(SECRET))  # the key's name, as planted
    os.symlink(keys, cache / "swap")
    _exchange(cache / "kernel", cache / "swap")  # renameat2 works on this file system
    _exchange(cache / "kernel", cache / "swap")
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(cache / "kernel"), str(cache / "swap")]
    )
    keyring = Keyring(KEY)
    deadline, uploads = time.monotonic() + 60, 0
    try:
        while uploads < 2000 and time.monotonic() < deadline:
            try:
                files = scan_cache(cache)
            except (ArtifactError, OSError):
                continue
            assert SECRET_SHA256 not in {f.sha256 for f in files}, f"the key listed ({uploads})"
            if files:
                _, chunks = pack_cache(cache, "triton", "s" * 64, files, keyring=keyring)
                assert SECRET not in _stream(chunks), f"the key was packed (upload {uploads})"
                uploads += 1
    finally:
        swapper.kill()
        swapper.wait(10)
    assert uploads > 100


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_another_users_files_are_left_out_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    (cache / "k1").mkdir(parents=True)
    (cache / "k1" / "mine.cubin").write_bytes(b"mine")
    (cache / "k1" / "theirs.cubin").write_bytes(b"theirs")
    (cache / "k1" / "open.cubin").write_bytes(b"open")
    (cache / "k1" / "group.cubin").write_bytes(b"group")  # umask 002: this user's, shared
    os.chmod(cache / "k1" / "group.cubin", 0o664)
    os.chown(cache / "k1" / "theirs.cubin", 65534, -1)
    os.chmod(cache / "k1" / "open.cubin", 0o666)
    with caplog.at_level(logging.WARNING, logger="plancache"):
        files = scan_cache(cache)
    assert [f.path for f in files] == ["k1/group.cubin", "k1/mine.cubin"]
    assert "2 files left out" in caplog.text
    assert "2 another user could have written (1 owned by another user, 1 writable by all)" in (
        caplog.text
    )
    assert "one: k1/open.cubin" in caplog.text
    # a compile artifact: the same rule (vLLM's <key> directory)
    key_dir = tmp_path / "key"
    (key_dir / "rank_0_0").mkdir(parents=True)
    (key_dir / "rank_0_0" / "model").write_bytes(b"model")
    (key_dir / "inductor_cache" / "ab").mkdir(parents=True)
    (key_dir / "inductor_cache" / "ab" / "theirs.py").write_bytes(b"import os")
    os.chown(key_dir / "inductor_cache" / "ab" / "theirs.py", 65534, -1)
    manifest, _ = pack(key_dir, "f" * 64, "rank_0_0")
    assert [f.path for f in manifest.files] == ["rank_0_0/model"]
