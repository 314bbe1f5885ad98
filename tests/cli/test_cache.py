"""``plancache cache push`` and ``plancache cache pull``: a directory round trip through S3
(moto) and GCS (fake-gcs-server) with signing, refusals, the pull's record, and errors."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from plancache import open_store
from plancache.testing import child_env
from tests.cli.helpers import RemoteSpec, failure, ok, run

KEY = secrets.token_hex(32)
OTHER = secrets.token_hex(32)
FACTORS = ("--factor", "compiler=1.2.3", "--factor", "arch=sm_90")


def _fill(root: Path) -> dict[str, bytes]:
    """A JIT cache's directory: files named by their keys, one executable; its files."""
    files = {
        "ab/cdef0123/kernel.bin": secrets.token_bytes(5000),
        "ab/cdef0123/kernel.json": b'{"name": "k"}',
        "7f/launcher.so": secrets.token_bytes(300),
        "index.txt": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.chmod(root / "7f/launcher.so", 0o755)
    return files


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``root`` but the pull's record: its bytes and mode."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".plancache-")
    }


def test_a_directory_round_trips_through_a_remote_store_signed(
    tmp_path: Path, remote: RemoteSpec
) -> None:
    url, options = remote
    where = ("--url", url, "--storage-options", json.dumps(options))
    keyed = child_env(PLANCACHE_SIGNING_KEY=KEY)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _fill(src)
    args = ("--kind", "myjit", *FACTORS, *where)
    pushed = json.loads(ok("cache", "push", "--dir", str(src), *args, "--json", env=keyed))
    assert (pushed["files"], pushed["written"]) == (4, {"store": True})
    store = open_store(url, **options)
    try:
        [name] = list(store.layer.list_objects("cache_myjit_"))
    finally:
        store.close()
    assert pushed["scope"] in name

    pulled = json.loads(ok("cache", "pull", "--dir", str(dst), *args, "--json", env=keyed))
    assert (pulled["reason"], pulled["bundles"], pulled["installed"]) == ("hit", 1, 4)
    assert _tree(dst) == _tree(src)
    assert _tree(dst)["7f/launcher.so"][1] == 0o755

    # another key: refused, nothing installed, exit 1, the refusal named
    wrong = tmp_path / "wrong"
    result = run(
        "cache", "pull", "--dir", str(wrong), *args, env=child_env(PLANCACHE_SIGNING_KEY=OTHER)
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "0 files installed" in result.stdout and name in result.stderr
    assert _tree(wrong) == {}
    # no key at all: unsigned-or-not, a remote store's bundles are code: refused
    result = run("cache", "pull", "--dir", str(wrong), *args, env=child_env())
    assert result.returncode == 1 and "--trust-unsigned" in result.stderr
    assert _tree(wrong) == {}
    # another scope: nothing there
    other = ("--kind", "myjit", "--factor", "compiler=9", *where)
    assert ": miss, 0 bundles" in ok("cache", "pull", "--dir", str(wrong), *other, env=keyed)


def test_unsigned_bundles_of_a_remote_store_need_the_opt_in(
    tmp_path: Path, s3_spec: RemoteSpec
) -> None:
    url, options = s3_spec
    args = ("--kind", "myjit", *FACTORS, "--url", url, "--storage-options", json.dumps(options))
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _fill(src)
    ok("cache", "push", "--dir", str(src), *args)
    assert run("cache", "pull", "--dir", str(dst), *args).returncode == 1
    assert _tree(dst) == {}
    assert "hit, 1 bundle, 4 files" in ok(
        "cache", "pull", "--dir", str(dst), *args, "--trust-unsigned"
    )
    assert _tree(dst) == _tree(src)


def test_a_push_after_a_pull_stores_only_what_the_directory_added(tmp_path: Path) -> None:
    store = tmp_path / "store"  # a local store only this user can write: trusted unsigned
    args = ("--kind", "myjit", *FACTORS, "--url", str(store))
    first, node, new = tmp_path / "first", tmp_path / "node", tmp_path / "new"
    first.mkdir()
    _fill(first)
    assert "4 files stored as one bundle" in ok("cache", "push", "--dir", str(first), *args)
    ok("cache", "pull", "--dir", str(node), *args)
    assert "nothing new: nothing stored" in ok("cache", "push", "--dir", str(node), *args)
    (node / "cd" / "added.bin").parent.mkdir()
    (node / "cd" / "added.bin").write_bytes(b"compiled on this node")
    pushed = json.loads(ok("cache", "push", "--dir", str(node), *args, "--json"))
    assert pushed["files"] == 1  # its own file only, not a second copy of the others
    assert len(list(open_store(str(store)).layer.list_objects("cache_myjit_"))) == 2
    pulled = json.loads(ok("cache", "pull", "--dir", str(new), *args, "--json"))
    assert (pulled["bundles"], pulled["installed"]) == (2, 5)
    assert _tree(new) == _tree(node)
    # --all ignores the pull's record, not the store: every file is held by a stored bundle
    assert (
        json.loads(ok("cache", "push", "--dir", str(new), *args, "--all", "--json"))["files"] == 0
    )
    other = ("--kind", "myjit", *FACTORS, "--url", str(tmp_path / "other"))
    (tmp_path / "other").mkdir()
    assert (
        json.loads(ok("cache", "push", "--dir", str(new), *other, "--all", "--json"))["files"] == 5
    )


def test_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    store, there = tmp_path / "store", tmp_path / "dir"
    there.mkdir()
    (there / "f").write_bytes(b"x")
    url = ("--url", str(store))
    assert "needs --dir and the factors" in failure(
        "cache", "push", "--kind", "myjit", "--dir", str(there), *url
    )
    assert "is not a cache kind" in failure(
        "cache", "push", "--kind", "Bad-Kind", "--dir", str(there), "--factor", "a=1", *url
    )
    assert "is not a cache kind" in failure(
        "cache", "push", "--kind", "compile", "--dir", str(there), "--factor", "a=1", *url
    )
    assert "is computed" in failure("cache", "push", "--kind", "triton", "--factor", "a=1", *url)
    assert "not a factor" in failure(
        "cache", "push", "--kind", "myjit", "--factor", "novalue", *url
    )
    assert "not a directory" in failure(
        "cache", "push", "--kind", "myjit", "--dir", str(tmp_path / "none"), "--factor", "a=1", *url
    )
    assert "no store there" in failure(
        "cache", "pull", "--kind", "myjit", "--dir", str(there), "--factor", "a=1", *url
    )
    read_only = child_env(PLANCACHE_READ_ONLY="1")
    err = failure(
        "cache",
        "push",
        "--kind",
        "myjit",
        "--dir",
        str(there),
        "--factor",
        "a=1",
        *url,
        env=read_only,
    )
    assert "not written to the store" in err
    assert not store.exists() or not list(store.glob("cache_*"))


def test_a_pull_that_meets_other_files_names_them_and_the_push_leaves_them(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    args = ("--kind", "myjit", *FACTORS, "--url", str(store))
    first, node = tmp_path / "first", tmp_path / "node"
    first.mkdir()
    _fill(first)
    ok("cache", "push", "--dir", str(first), *args)
    for rel, data in (("7f/launcher.so", b""), ("ab/cdef0123/kernel.bin", b"garbage")):
        (node / rel).parent.mkdir(parents=True, exist_ok=True)
        (node / rel).write_bytes(data)
    (node / "mine.txt").write_bytes(b"the user's own")
    pulled = run("cache", "pull", "--dir", str(node), *args)
    assert pulled.returncode == 0, pulled.stderr
    assert "hit, 1 bundle, 2 files installed" in pulled.stdout
    assert "2 files differ from the stored bundles'" in pulled.stderr
    assert "7f/launcher.so, ab/cdef0123/kernel.bin" in pulled.stderr
    assert "1 file there before the pull that no bundle holds" in pulled.stdout
    assert (node / "7f/launcher.so").read_bytes() == b""  # kept as it was
    # the user's file is not this program's: never stored for every node
    assert "nothing new: nothing stored" in ok("cache", "push", "--dir", str(node), *args)
    assert len(list(store.glob("cache_myjit_*"))) == 1
    # --all stores what the record leaves out (the user said so)
    pushed = json.loads(ok("cache", "push", "--dir", str(node), *args, "--all", "--json"))
    assert pushed["files"] == 1  # mine.txt alone: the others are stored


def test_push_and_pull_say_files_and_bytes_and_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    args = ("--kind", "myjit", *FACTORS, "--url", str(store))
    first, node = tmp_path / "first", tmp_path / "node"
    first.mkdir()
    total = sum(len(v) for v in _fill(first).values())
    out = ok("cache", "push", "--dir", str(first), *args, "--dry-run")
    assert "4 files would be stored (5.2 KiB) as one bundle" in out and "nothing written" in out
    assert list(store.glob("cache_*")) == []
    dry = json.loads(ok("cache", "push", "--dir", str(first), *args, "--dry-run", "--json"))
    assert (dry["files"], dry["bytes"], dry["dry_run"], dry["written"]) == (4, total, True, {})
    out = ok("cache", "push", "--dir", str(first), *args)
    assert "4 files stored as one bundle (5.2 KiB)" in out and "0 files skipped" in out
    pulled = json.loads(ok("cache", "pull", "--dir", str(node), *args, "--json"))
    assert (pulled["installed"], pulled["installed_bytes"], pulled["skipped"]) == (4, total, 0)
    out = ok("cache", "pull", "--dir", str(node), *args)
    assert "0 files installed (0 B), 4 files there already (5.2 KiB)" in out
    again = json.loads(ok("cache", "push", "--dir", str(node), *args, "--json"))
    assert (again["files"], again["skipped"], again["skipped_bytes"]) == (0, 4, total)


def test_ls_rm_prune_and_doctor_speak_of_bundles(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    assert ok("ls", "--url", str(store)).splitlines()[-1] == f"nothing stored, in {store}"
    scopes = {}
    for n, compiler in enumerate(("1.2.3", "1.2.3", "1.2.3", "9.0")):
        where = tmp_path / f"d{n}"
        (where / "k").mkdir(parents=True)
        (where / "k" / f"kernel{n}.bin").write_bytes(secrets.token_bytes(100 + n))
        args = ("--kind", "myjit", "--factor", f"compiler={compiler}", "--factor", "arch=sm_90")
        url = ("--url", str(store))
        pushed = json.loads(ok("cache", "push", "--dir", str(where), *args, *url, "--json"))
        scopes[compiler] = pushed["scope"]  # pushed one after another: the last is newest
    listed = ok("ls", "--url", str(store))
    # each bundle by its object name, kind, scope in words and size; no plans spoken of
    assert listed.splitlines()[-1] == f"4 cache bundles, in {store}"
    assert "BUNDLE" in listed and "CACHE" in listed and "arch sm_90, compiler 1.2.3" in listed
    assert "101 B" in listed and f"cache_myjit_{scopes['1.2.3']}_" in listed
    rows = json.loads(ok("ls", "--url", str(store), "--json"))
    assert {r["factors"]["compiler"] for r in rows} == {"1.2.3", "9.0"}
    assert "4 cache bundles" in run("doctor", str(store)).stdout
    # prune: keep the newest N of each scope (1.2.3 has three, 9.0 one)
    out = ok("prune", "--keep-newest", "1", "--url", str(store))
    assert "deleted 2 cache bundles past the newest 1 of their scope" in out
    assert len(list(store.glob(f"cache_myjit_{scopes['1.2.3']}_*"))) == 1
    assert len(list(store.glob(f"cache_myjit_{scopes['9.0']}_*"))) == 1
    # rm: every bundle of one scope
    out = ok("rm", f"cache_myjit_{scopes['9.0']}", "--url", str(store))
    assert out.count("deleted cache_myjit_") == 1
    assert list(store.glob(f"cache_myjit_{scopes['9.0']}_*")) == []
    assert "plans only" not in ok("rm", "--help") and "cache_<kind>_<scope>" in ok("rm", "--help")
