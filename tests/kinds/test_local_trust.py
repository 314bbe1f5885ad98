"""Which local stores are trusted without keys: ``ArtifactStore.fetch`` refuses an unsigned
artifact from a local directory that is not owned by this user or root, or that group or
others can write (itself or the artifact's file): reason ``untrusted``, one warning on the
``plancache`` logger naming that path. ``plancache cp`` into a local store skips unsigned
artifacts (its output says ``skipped`` and names each) unless ``--trust-unsigned`` is given."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from plancache._artifacts.store import ArtifactStore
from plancache.testing import child_env
from plancache.testing.servers import MotoS3
from tests.helpers import LOOSE_OPTIONS
from tests.kinds.helpers import (
    K1,
    KEY,
    OTHER_KEY,
    RANK,
    REF,
    artifacts,
    cli,
    make_tree,
    output,
    upload,
)


# -- which local directories are trusted without keys --------------------------------------
def _untrusted(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    store: ArtifactStore,
    offending: Path,
) -> None:
    target = tmp_path / "node-b" / KEY
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="plancache"):
        fetched = store.fetch(target, KEY, RANK)
    assert fetched.reason == "untrusted", f"installed from {offending} ({fetched.reason})"
    assert not (target / RANK).exists()
    named = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and str(offending) in r.getMessage()
    ]
    assert len(named) == 1, [r.getMessage() for r in caplog.records]


def _trusted_first(store: ArtifactStore, tmp_path: Path) -> None:
    """The control: the same store, owned by this user, 0o755 and 0o644, serves."""
    fetched = store.fetch(tmp_path / "node-a" / KEY, KEY, RANK)
    assert fetched.reason == "hit"


def _unsafe(path: Path, how: str) -> None:
    if how == "owner":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(path, 65534, 65534)  # nobody
    else:
        path.chmod(int(how, 8))


@pytest.mark.parametrize("how", ["0775", "0777", "owner"])
def test_store_directory_others_can_write_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    root = tmp_path / "store"
    upload(root, tmp_path)
    root.chmod(0o755)
    store = artifacts(str(root))
    try:
        _trusted_first(store, tmp_path)
        _unsafe(root, how)
        _untrusted(tmp_path, caplog, store, root)
    finally:
        store.close()


@pytest.mark.parametrize("how", ["0664", "0666", "owner"])
def test_artifact_file_others_can_write_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    root.chmod(0o755)
    assert path.stat().st_mode & 0o777 == 0o644
    store = artifacts(str(root))
    try:
        _trusted_first(store, tmp_path)
        _unsafe(path, how)
        _untrusted(tmp_path, caplog, store, path)
    finally:
        store.close()


@pytest.mark.parametrize("how", ["0775", "0777"])
def test_local_tier_others_can_write_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    tier = tmp_path / "tier"
    upload(tier, tmp_path)
    tier.chmod(0o755)
    (tmp_path / "empty").mkdir()
    store = artifacts(str(tmp_path / "empty"), local_tier=str(tier))
    try:
        _trusted_first(store, tmp_path)
        _unsafe(tier, how)
        _untrusted(tmp_path, caplog, store, tier)
    finally:
        store.close()


# -- cp of code into a local store ---------------------------------------------------------
S3Spec = tuple[str, dict[str, Any]]


@pytest.fixture
def s3_store(moto_s3: MotoS3, s3_bucket: str) -> S3Spec:
    """A fresh, empty store on moto (URL, storage options with loose time bounds)."""
    url = f"s3://{s3_bucket}/plans"
    options: dict[str, Any] = {"endpoint_url": moto_s3.endpoint, **LOOSE_OPTIONS}
    return url, options


def _upload_remote(spec: S3Spec, tmp_path: Path, key: str, signing_key: str | None = None) -> None:
    url, options = spec
    tree = make_tree(tmp_path / f"tree-{key[:4]}" / key)
    store = artifacts(url, storage_options=options, signing_key=signing_key)
    try:
        assert store.upload(tree, key, RANK) == {"store": True}
    finally:
        store.close()


def _cp(spec: S3Spec, dst: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    url, options = spec
    opts = json.dumps(options)
    return cli("cp", url, str(dst), "--storage-options", opts, *extra, env=child_env(**env))


def _names(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def test_cp_into_a_local_store_skips_unsigned_artifacts(tmp_path: Path, s3_store: S3Spec) -> None:
    _upload_remote(s3_store, tmp_path, KEY)
    dst = tmp_path / "dst"
    result = _cp(s3_store, dst)
    assert result.returncode == 0, output(result)
    copied = [n for n in _names(dst) if KEY in n]
    assert copied == [], f"unsigned artifacts copied into a local store: {copied}"
    out = result.stdout + result.stderr
    assert "skipped" in out and (REF in out or f"compile_artifact_{KEY}" in out), output(result)
    node = artifacts(str(dst))
    try:
        assert node.fetch(tmp_path / "node-a" / KEY, KEY, RANK).reason == "miss"
    finally:
        node.close()


def test_cp_trust_unsigned_copies_unsigned_artifacts(tmp_path: Path, s3_store: S3Spec) -> None:
    _upload_remote(s3_store, tmp_path, KEY)
    dst = tmp_path / "dst"
    result = _cp(s3_store, dst, "--trust-unsigned")
    assert result.returncode == 0, output(result)
    assert [n for n in _names(dst) if KEY in n], output(result)


def test_cp_with_keys_copies_signed_artifacts_only(tmp_path: Path, s3_store: S3Spec) -> None:
    _upload_remote(s3_store, tmp_path, KEY)  # unsigned
    _upload_remote(s3_store, tmp_path, OTHER_KEY, signing_key=K1)
    dst = tmp_path / "dst"
    result = _cp(s3_store, dst, PLANCACHE_VERIFY_KEYS=K1)
    assert result.returncode == 0, output(result)
    names = _names(dst)
    assert [n for n in names if OTHER_KEY in n], f"the signed artifact was not copied: {names}"
    assert not [n for n in names if KEY in n], f"the unsigned artifact was copied: {names}"
