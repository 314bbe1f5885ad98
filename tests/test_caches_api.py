"""The public cache API (``plancache.caches``) as a program uses it: what a pull meets in
the directory (files of other bytes kept and named, files that were there before never
spread by the next push), and what a pull and a push report (files and bytes written and
skipped, a push's dry run)."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import pytest

from plancache.caches import CacheShare, GeneratedCache, directory_cache

FACTORS = {"compiler": "1.2.3"}
FILES = {
    "ab/cdef0123/kernel.bin": secrets.token_bytes(5000),
    "ab/cdef0123/kernel.json": b'{"name": "k"}',
    "7f/launcher.so": secrets.token_bytes(300),
    "fxgraph/xy/entry": secrets.token_bytes(700),
}


def _share(tmp_path: Path) -> CacheShare:
    (tmp_path / "store").mkdir(exist_ok=True)
    return CacheShare.from_env(
        {"PLANCACHE_URL": str(tmp_path / "store"), "PLANCACHE_LOCAL_TIER": "0"}
    )


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _cache(root: Path) -> GeneratedCache:
    return directory_cache("myjit", root, FACTORS)


def _stored(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "store").glob("cache_myjit_*"))


def test_a_pull_that_meets_other_files_names_them_and_the_next_push_never_spreads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, node = tmp_path / "first", tmp_path / "node"
    _write(first, FILES)
    with _share(tmp_path) as share:
        assert share.push(_cache(first)).files == 4
        bundle = _stored(tmp_path)
        # the user's directory: a 0-byte .so and a garbage FX-graph entry where the bundle
        # has files, one of the bundle's files as it is, and a file of their own
        _write(
            node,
            {
                "7f/launcher.so": b"",
                "fxgraph/xy/entry": b"garbage",
                "ab/cdef0123/kernel.json": FILES["ab/cdef0123/kernel.json"],
                "mine/notes.bin": b"the user's own",
            },
        )
        with caplog.at_level(logging.WARNING, logger="plancache"):
            pulled = share.pull(_cache(node))
        assert (pulled.reason, pulled.bundles, pulled.installed) == ("hit", 1, 1)
        assert (node / "7f/launcher.so").read_bytes() == b""  # left as they are
        assert (node / "fxgraph/xy/entry").read_bytes() == b"garbage"

        # the program runs and adds one file: the push stores it alone, never the user's
        _write(node, {"cd/added.bin": b"compiled by this run"})
        pushed = share.push(_cache(node), pulled.known)
        assert pushed.files == 1
        assert len(_stored(tmp_path)) == 2
        again = tmp_path / "again"
        assert share.pull(_cache(again)).installed == 5
        assert not (again / "mine").exists()
        assert (pushed.bytes, pushed.written) == (20, {"store": True})
        assert pushed.skipped == 5  # the bundle's 4 paths and the user's own file

        # what the pull met is reported: counts, bytes, the names, said once
        assert pulled.installed_bytes == 5000
        assert (pulled.skipped, pulled.skipped_bytes) == (1, len(b'{"name": "k"}'))
        assert pulled.differing == ("7f/launcher.so", "fxgraph/xy/entry")
        assert pulled.found == {"mine/notes.bin"}
        [line] = [r.getMessage() for r in caplog.records if "differ" in r.getMessage()]
        assert "2 files differ" in line and "7f/launcher.so, fxgraph/xy/entry" in line
        assert set(_stored(tmp_path)) >= set(bundle)


def test_a_push_reports_bytes_written_and_skipped_and_a_dry_run_writes_nothing(
    tmp_path: Path,
) -> None:
    first = tmp_path / "first"
    _write(first, FILES)
    total = sum(len(v) for v in FILES.values())
    with _share(tmp_path) as share:
        dry = share.push(_cache(first), dry_run=True)
        assert (dry.files, dry.bytes, dry.written, dry.dry_run) == (4, total, {}, True)
        assert _stored(tmp_path) == []
        calls: list[tuple[int, int]] = []
        pushed = share.push(_cache(first), progress=lambda *done: calls.append(done))
        assert (pushed.files, pushed.bytes, pushed.written) == (4, total, {"store": True})
        assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]  # a progress bar's calls, per file
        calls.clear()
        assert share.pull(_cache(tmp_path / "node"), progress=lambda *done: calls.append(done))
        assert calls == [(1, 1)]  # per bundle read
        assert pushed.stored and (pushed.skipped, pushed.skipped_bytes) == (0, 0)
        # all of it stored already: nothing new, every file skipped, nothing written
        again = share.push(_cache(first))
        assert (again.files, again.written, again.stored) == (0, {}, False)
        assert (again.skipped, again.skipped_bytes) == (4, total)
