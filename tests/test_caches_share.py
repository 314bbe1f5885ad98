"""The cache API as a PyTorch user meets it (issue 45): a store URL parsed strictly in one
place, the store used named in the log, a first boot that is a miss, one bundle counted
once through the local tier, an unsigned remote push said once, and ``sharing``: pull at
enter, push at exit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from plancache import caches, open_store
from plancache._config import Settings, is_remote
from plancache.caches import CacheShare, directory_cache
from plancache.errors import PlancacheError, UnknownSchemeError, UnsupportedStoreError
from plancache.testing import make_plan
from plancache.testing.servers import MotoS3
from tests.helpers import LOOSE_OPTIONS

FACTORS = {"compiler": "1.2.3"}
KEY = "cd" * 32


@pytest.mark.parametrize("url", ["s3:/fleet/caches", "file:/data/store", "gs:bucket", "S3:x"])
def test_a_scheme_without_slashes_is_an_error_never_a_relative_path(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for opening in (
        lambda: CacheShare.from_env({"PLANCACHE_URL": url}),
        lambda: Settings.from_env({"PLANCACHE_URL": url}),
        lambda: open_store(url),
    ):
        with pytest.raises(UnsupportedStoreError, match="is not followed by '//'") as raised:
            opening()
        assert "s3://bucket/prefix" in str(raised.value)
        assert isinstance(raised.value, PlancacheError)
    assert list(tmp_path.iterdir()) == []


def test_from_env_raises_for_an_unknown_scheme_as_it_says() -> None:
    with pytest.raises(UnknownSchemeError, match="unknown store scheme 's4'"):
        CacheShare.from_env({"PLANCACHE_URL": "s4://bucket/caches"})


def test_local_paths_stay_local_whatever_their_case_or_colons(tmp_path: Path) -> None:
    assert not is_remote(f"FILE://{tmp_path}") and not is_remote("./a:b")
    assert is_remote("S3://bucket/x")
    store = open_store(f"FILE://{tmp_path}/store")  # not a relative ./FILE: directory
    try:
        store.put(make_plan())
    finally:
        store.close()
    assert list((tmp_path / "store").glob("startup_plan_*.json"))


def test_the_log_names_the_store_and_says_when_nothing_leaves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm")}  # no PLANCACHE_URL
    caplog.set_level(logging.INFO, logger="plancache")
    CacheShare.from_env(env).close()
    CacheShare.from_env(env).close()  # once per process and store
    said = [r for r in caplog.records if "generated caches: store" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert f"store {tmp_path / 'vllm' / 'startup_plan'} (the local default" in said[0].getMessage()
    assert "nothing leaves this machine" in said[0].getMessage()
    caplog.clear()
    CacheShare.from_env({"PLANCACHE_URL": str(tmp_path / "given")}).close()
    [given] = [r for r in caplog.records if "generated caches: store" in r.getMessage()]
    assert given.levelno == logging.INFO


def _s3_env(moto_s3: MotoS3, bucket: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "PLANCACHE_URL": f"s3://{bucket}/caches",
        "PLANCACHE_STORAGE_OPTIONS": json.dumps(
            {"endpoint_url": moto_s3.endpoint, **LOOSE_OPTIONS}
        ),
        "PLANCACHE_LOCAL_TIER": str(tmp_path / "tier"),
        "PLANCACHE_TRUST_PRECONDITIONS": "1",
        **extra,
    }


def test_a_first_pull_from_an_empty_remote_store_is_a_miss(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str
) -> None:
    with CacheShare.from_env(_s3_env(moto_s3, s3_bucket, tmp_path)) as share:
        assert share.pull(directory_cache("myjit", tmp_path / "c", FACTORS)).reason == "miss"


def test_one_bundle_through_the_local_tier_is_counted_once(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The library keeps a copy of what it pushes and pulls in its local tier (read first:
    a restart reads no remote object twice); a bundle in both is one bundle."""
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "5e").mkdir(parents=True)
    (first / "5e" / "kernel.bin").write_bytes(b"compiled")
    env = _s3_env(moto_s3, s3_bucket, tmp_path, PLANCACHE_SIGNING_KEY=KEY)
    with CacheShare.from_env(env) as share:
        pushed = share.push(directory_cache("myjit", first, FACTORS))
        assert pushed.written == {"store": True, "local-tier": True}
        pulled = share.pull(directory_cache("myjit", second, FACTORS))
    assert (pulled.reason, pulled.bundles, pulled.installed) == ("hit", 1, 1)
    assert "never install" not in caplog.text  # signed


def test_an_unsigned_push_to_a_remote_store_is_said_once(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "c"
    root.mkdir()
    env = _s3_env(moto_s3, s3_bucket, tmp_path, PLANCACHE_LOCAL_TIER="0")
    with CacheShare.from_env(env) as share:
        for name in ("a.bin", "b.bin"):
            (root / name).write_bytes(name.encode())
            assert share.push(directory_cache("myjit", root, FACTORS), {"a.bin"} - {name}).files
    said = [r for r in caplog.records if "never install them" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "PLANCACHE_SIGNING_KEY" in said[0].getMessage()


def test_sharing_pulls_at_enter_and_pushes_at_exit_even_after_a_failure(tmp_path: Path) -> None:
    env = {"PLANCACHE_URL": str(tmp_path / "store")}
    first, second = tmp_path / "first", tmp_path / "second"
    with (
        pytest.raises(RuntimeError),
        caches.sharing(directory_cache("myjit", first, FACTORS), environ=env) as shared,
    ):
        assert shared.pulled[0].reason == "miss"
        (first / "kernel.bin").write_bytes(b"compiled")
        raise RuntimeError("the program failed after compiling")
    assert shared.pushed[0] is not None and shared.pushed[0].files == 1
    with caches.sharing(directory_cache("myjit", second, FACTORS), environ=env) as shared:
        assert (second / "kernel.bin").read_bytes() == b"compiled"
    assert shared.pushed[0] is not None and shared.pushed[0].files == 0
