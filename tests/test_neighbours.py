"""What another local user could have written: read one way (``plancache._neighbours``), and
the conformance verdicts a neighbour plants in the node's cache directory taken as no
verdict (the node probes), never waited on, never read without end, never logged raw."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from plancache._backends.verdicts import VerdictCache
from plancache._neighbours import MAX_DEPTH, OddFileError, open_entry, read_file, walk
from plancache._probe import ProbeResult, StoreVerdict
from tests.helpers import within

OTHER_UID = 65534
"""A user other than this one (``nobody``)."""
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
IDENT = "s3://b/p\nhttp://e"
LIES = ProbeResult(StoreVerdict.LIES, "create-existing", "a create of an existing key succeeded")


def test_a_regular_file_of_this_user_is_read_and_judged(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "f").write_bytes(b"x" * 10)
    read = read_file(tmp_path, "d/f", 10)
    assert read is not None and read.data == b"x" * 10 and read.foreign is None
    assert read_file(tmp_path, "d/absent", 10) is None
    assert read_file(tmp_path, "absent/f", 10) is None
    with pytest.raises(OddFileError, match="over 9 bytes"):
        read_file(tmp_path, "d/f", 9)
    with pytest.raises(ValueError):
        read_file(tmp_path, "d/../d/f", 10)


def test_links_fifos_and_devices_are_refused_never_followed_or_waited_on(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"secret")
    os.symlink(tmp_path / "real" / "f", tmp_path / "link")
    os.symlink(tmp_path / "real", tmp_path / "dirlink")
    os.symlink("/dev/zero", tmp_path / "zero")
    os.mkfifo(tmp_path / "fifo")
    for relative, what in [
        ("link", "a symbolic link"),
        ("dirlink/f", "a symbolic link"),
        ("zero", "a symbolic link"),
        ("fifo", "a FIFO"),
    ]:
        with pytest.raises(OddFileError, match=what):  # a FIFO waited on would never answer
            within(30, functools.partial(read_file, tmp_path, relative, 1 << 20))


@as_root
def test_what_another_user_could_have_written_is_named(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "f").write_bytes(b"{}")
    os.chown(tmp_path / "d" / "f", OTHER_UID, -1)
    read = read_file(tmp_path, "d/f", 10)
    assert read is not None and read.foreign == f"file {tmp_path}/d/f is owned by uid {OTHER_UID}"
    os.chown(tmp_path / "d" / "f", 0, -1)
    os.chmod(tmp_path / "d", 0o775)
    read = read_file(tmp_path, "d/f", 10)
    assert read is not None and read.foreign is not None
    assert read.foreign.startswith(f"directory {tmp_path}/d is writable by its group or others")
    # the anchor is the configuration's: a group-writable one does not make what is below
    # it foreign (a neighbour can replace what it holds, never with this user's files)
    os.chmod(tmp_path / "d", 0o700)
    os.chmod(tmp_path, 0o775)
    read = read_file(tmp_path, "d/f", 10)
    assert read is not None and read.foreign is None


def test_a_walk_goes_by_descriptors_and_never_follows_a_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "key").write_bytes(b"secret")
    (root / "a" / "b" / "f").write_bytes(b"data")
    (root / "top").write_bytes(b"t")
    os.symlink(outside, root / "a" / "dirlink")
    os.symlink(outside / "key", root / "a" / "filelink")
    (root / ".hidden").write_bytes(b"h")
    entries = list(walk(root, skip=lambda name, directory: name.startswith(".")))
    assert [e.path for e in entries] == ["a/b/f", "a/dirlink", "a/filelink", "top"]
    read = {}
    for entry in walk(root):
        try:
            fd = open_entry(entry)
        except OddFileError as exc:
            assert "a symbolic link" in str(exc)
            continue
        with os.fdopen(fd, "rb") as f:
            read[entry.path] = f.read()
    assert read == {"a/b/f": b"data", "top": b"t", ".hidden": b"h"}  # never the key


def test_a_file_or_directory_swapped_after_the_listing_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"data")
    (tmp_path / "key").write_bytes(b"secret")
    entries = walk(root)
    entry = next(entries)
    assert entry.path == "d/f"
    os.rename(root / "d" / "f", root / "d" / "old")
    os.symlink(tmp_path / "key", root / "d" / "f")  # swapped for a link
    with pytest.raises(OddFileError, match="a symbolic link"):
        open_entry(entry)
    os.unlink(root / "d" / "f")
    (root / "d" / "f").write_bytes(b"another")  # another file under the same name
    with pytest.raises(OddFileError, match="another file than the one listed"):
        open_entry(entry)
    assert list(entries) == []  # the walk ends on its own listing, nothing re-read
    # a directory swapped for a link between its listing and its opening is not walked
    (root / "d2").mkdir()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k").write_bytes(b"secret")
    seen = []
    for e in walk(root):
        seen.append(e.path)
        if e.path == "d/f":
            os.rename(root / "d2", tmp_path / "d2-away")
            os.symlink(tmp_path / "keys", root / "d2")
    assert not any(p.startswith("d2/") for p in seen), seen


def test_a_walk_is_bounded_in_depth(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d"] * (MAX_DEPTH + 3))
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    (tmp_path / "d" / "g").write_bytes(b"x")
    too_deep = "/".join(["d"] * (MAX_DEPTH + 1))  # yielded itself, for the caller to count
    assert [e.path for e in walk(tmp_path)] == [too_deep, "d/g"]


def _plant(cache: VerdictCache, data: bytes) -> Path:
    """Save a real verdict, then put ``data`` in its file's place; the file's path."""
    cache.save(IDENT, "s3://b/p", LIES)
    (path,) = [p for p in cache.directory.iterdir() if p.suffix == ".json"]
    path.write_bytes(data)
    return path


@as_root
def test_a_verdict_another_user_planted_is_no_verdict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A planted ``lies`` stopped every remote write for a day; now the node probes."""
    cache = VerdictCache(tmp_path / "conformance")
    record = {"verdict": "lies", "step": "x", "detail": "planted", "at": time.time()}
    path = _plant(cache, json.dumps(record).encode())
    assert cache.load(IDENT) is not None  # this user's: taken
    os.chown(path, OTHER_UID, -1)
    with caplog.at_level(logging.WARNING, logger="plancache"):
        assert cache.load(IDENT) is None
        assert cache.load(IDENT) is None
    assert caplog.text.count("cached conformance verdicts in") == 1
    assert f"owned by uid {OTHER_UID}" in caplog.text


def test_a_fifo_or_a_link_to_a_device_is_no_verdict_at_once(tmp_path: Path) -> None:
    """A FIFO made every write wait 11 s and left a probe thread blocked; a link to
    /dev/zero read 1.9 GiB."""
    cache = VerdictCache(tmp_path / "conformance")
    path = _plant(cache, b"")
    path.unlink()
    os.mkfifo(path)
    results: list[object] = []
    reader = threading.Thread(target=lambda: results.append(cache.load(IDENT)), daemon=True)
    reader.start()
    reader.join(2.0)
    assert not reader.is_alive() and results == [None]
    path.unlink()
    os.symlink("/dev/zero", path)
    assert cache.load(IDENT) is None


def test_a_verdicts_detail_is_logged_escaped_and_cut(tmp_path: Path) -> None:
    cache = VerdictCache(tmp_path / "conformance")
    forged = "x\nplancache: forged line\x1b[2J" + "y" * 2000
    record = {"verdict": "lies", "step": "x", "detail": forged, "at": time.time()}
    _plant(cache, json.dumps(record).encode())
    found = cache.load(IDENT)
    assert found is not None
    assert "\n" not in found[0].detail and "\x1b" not in found[0].detail
    assert found[0].detail.startswith("x\\nplancache: forged line\\x1b[2J")
    assert len(found[0].detail) == 500


def test_the_verdicts_directory_is_made_this_users_alone(tmp_path: Path) -> None:
    """Created 0775 under umask 002 before; now 0700, and an existing one of this user's
    is made so."""
    old = os.umask(0o002)
    try:
        VerdictCache(tmp_path / "new").save(IDENT, "s3://b/p", LIES)
        (tmp_path / "old").mkdir(mode=0o775)
        VerdictCache(tmp_path / "old").save(IDENT, "s3://b/p", LIES)
    finally:
        os.umask(old)
    for name in ("new", "old"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o700
        assert VerdictCache(tmp_path / name).load(IDENT) is not None
