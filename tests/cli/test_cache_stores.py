"""Where ``plancache cache`` writes, and what a first boot reads: a mistyped store URL is an
error naming the accepted forms (never a relative directory); no store configured is the
local default, said on the first line; an empty remote store is a ``miss`` (exit 0) whose
hint names the key the producer needs; an unsigned push to a remote store says, once, that
keyed nodes will not take it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plancache.testing import child_env
from tests.cli.helpers import RemoteSpec, ok, run

ARGS = ("--kind", "myjit", "--factor", "compiler=1.2.3")


@pytest.mark.parametrize("url", ["s3:/fleet/caches", "file:/data/store", "gs:bucket", "s4://x/y"])
def test_a_mistyped_store_url_writes_nothing_and_names_the_accepted_forms(
    tmp_path: Path, url: str
) -> None:
    there = tmp_path / "dir"
    there.mkdir()
    (there / "f.bin").write_bytes(b"compiled")
    for verb in ("push", "pull"):
        result = run("cache", verb, *ARGS, "--dir", str(there), "--url", url, cwd=tmp_path)
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert "s3://bucket/prefix" in result.stderr and "file:///data/store" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]  # no ./s3:, ./file:, ./gs:


def test_no_store_configured_is_the_local_default_said_first(tmp_path: Path) -> None:
    there, home = tmp_path / "dir", tmp_path / "home"
    there.mkdir()
    (there / "f.bin").write_bytes(b"compiled")
    env = child_env(HOME=str(home))
    env.pop("VLLM_CACHE_ROOT", None)
    env.pop("XDG_CACHE_HOME", None)
    result = run("cache", "push", *ARGS, "--dir", str(there), env=env)
    assert result.returncode == 0, result.stderr
    default = home / ".cache" / "vllm" / "startup_plan"
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"plancache: store {default} (the local default")
    assert "PLANCACHE_URL is not set; nothing leaves this machine" in first
    assert list(default.glob("cache_myjit_*"))


def test_a_first_pull_from_an_empty_remote_store_is_a_miss(
    tmp_path: Path, s3_spec: RemoteSpec
) -> None:
    """No key, nothing stored: nothing was found, so nothing was refused (exit 0); the hint
    names the key the pushing node needs."""
    url, options = s3_spec
    where = ("--url", url, "--storage-options", json.dumps(options))
    result = run("cache", "pull", *ARGS, "--dir", str(tmp_path / "d"), *where, "--json")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert json.loads(result.stdout)["reason"] == "miss"
    assert "PLANCACHE_SIGNING_KEY where they are pushed" in result.stderr
    # what is found and refused stays untrusted (exit 1)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(b"compiled")
    pushed = run("cache", "push", *ARGS, "--dir", str(src), *where)
    assert pushed.returncode == 0, pushed.stderr
    said = "nodes with a key (PLANCACHE_SIGNING_KEY or PLANCACHE_VERIFY_KEYS) never install"
    assert pushed.stderr.count(said) == 1
    result = run("cache", "pull", *ARGS, "--dir", str(tmp_path / "d"), *where)
    assert result.returncode == 1 and ": untrusted, 0 bundles" in result.stdout
    assert "PLANCACHE_SIGNING_KEY where they are pushed" in result.stderr
    keyed = child_env(PLANCACHE_SIGNING_KEY="ab" * 32)
    (src / "g.bin").write_bytes(b"compiled too")
    signed = run("cache", "push", *ARGS, "--dir", str(src), *where, "--all", env=keyed)
    assert signed.returncode == 0 and "never install" not in signed.stderr
    assert ok("cache", "pull", *ARGS, "--dir", str(tmp_path / "e"), *where, env=keyed)
