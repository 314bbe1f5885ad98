"""Fetch, upload, trust and retraction of compile artifacts on real stores (a local directory,
S3 on moto, GCS on fake-gcs-server), with synthetic AOT directories (no vLLM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from plancache import open_store
from plancache._artifacts.engine import CompileSettings, Uploads
from plancache._artifacts.manifest import artifact_object_name
from plancache._artifacts.packing import pack
from plancache._artifacts.store import ArtifactStore
from plancache._backends import open_layer
from plancache._backends.gcs import GCSStore
from plancache._backends.s3 import S3Store
from plancache._config import Settings
from plancache._inventory.artifacts import names as artifact_names
from plancache._objects import PART_BYTES
from plancache._signing import Keyring
from plancache.errors import ConfigError
from plancache.testing import child_env
from plancache.testing.hostile import LyingProxy
from plancache.testing.servers import FakeGCS, MotoS3
from tests.artifacts.helpers import KEY, RANK, make_tree

K1, K2 = "k1-" + "a" * 30, "k2-" + "b" * 30
NAME = artifact_object_name(KEY, RANK)
NODE = Path(__file__).with_name("upload_node.py")


def s3(moto_s3: MotoS3, bucket: str) -> tuple[str, dict[str, Any]]:
    return f"s3://{bucket}/fleet", {"endpoint_url": moto_s3.endpoint, "timeout": 30.0}


def gcs(fake_gcs: FakeGCS, bucket: str) -> tuple[str, dict[str, Any]]:
    return f"gs://{bucket}/fleet", {"endpoint_url": fake_gcs.endpoint, "token": "anon"}


@pytest.fixture(autouse=True)
def _node_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This node's default directory (the conformance verdicts of remote stores) is the
    test's own."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "node"))


def store(
    url: str, options: dict[str, Any] | None = None, keyring: Keyring | None = None, **kw: Any
) -> ArtifactStore:
    tier = kw.pop("local_tier", None)
    settings = Settings(
        url,
        read_only=kw.pop("read_only", False),
        local_tier=tier,
        storage_options=options or {},
        keyring=keyring or Keyring(),
    )
    return ArtifactStore(settings, CompileSettings(**kw))


def test_local_store_shares_first_writer_wins(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    shared = store(str(tmp_path / "store"))
    assert shared.upload(src, KEY, RANK) == {"store": True}
    other = make_tree(tmp_path / "c" / KEY, model=b"another compile")
    assert shared.upload(other, KEY, RANK) == {"store": False}  # kept: the first serves all
    fetched = shared.fetch(tmp_path / "b" / KEY, KEY, RANK)
    assert fetched.reason == "hit" and fetched.source == "store"
    assert (tmp_path / "b" / KEY / RANK / "model").read_bytes() == (
        src / RANK / "model"
    ).read_bytes()
    assert shared.fetch(tmp_path / "b" / KEY, KEY, RANK).reason == "present"
    assert shared.fetch(tmp_path / "d" / KEY, KEY, "rank_1_0").reason == "miss"


@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_remote_unsigned_needs_the_opt_in(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url, options = _remote(backend, request)
    src = make_tree(tmp_path / "a" / KEY)
    assert store(url, options).upload(src, KEY, RANK) == {"store": True}
    refused = store(url, options).fetch(tmp_path / "b" / KEY, KEY, RANK)
    assert refused.reason == "untrusted" and not (tmp_path / "b" / KEY).exists()
    trusted = store(url, options, trust_unsigned=True).fetch(tmp_path / "c" / KEY, KEY, RANK)
    assert trusted.reason == "hit"
    assert (tmp_path / "c" / KEY / RANK / "model").read_bytes() == (
        src / RANK / "model"
    ).read_bytes()


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_keys_decide_whatever_the_store(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url, options = (str(tmp_path / "s"), {}) if backend == "local" else _remote(backend, request)
    src = make_tree(tmp_path / "a" / KEY)
    assert store(url, options, Keyring(K1)).upload(src, KEY, RANK) == {"store": True}
    ok = store(url, options, Keyring(verify_keys=[K1])).fetch(tmp_path / "b" / KEY, KEY, RANK)
    assert ok.reason == "hit"
    foreign = store(url, options, Keyring(verify_keys=[K2]))
    assert foreign.fetch(tmp_path / "c" / KEY, KEY, RANK).reason == "invalid"
    assert not (tmp_path / "c" / KEY / RANK).exists()


@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_a_store_that_ignores_preconditions_gets_no_artifact_and_no_unsigned_trust(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url, options = _remote(backend, request)
    src = make_tree(tmp_path / "a" / KEY)
    with LyingProxy(options["endpoint_url"]) as proxy:
        lying = dict(options, endpoint_url=proxy.endpoint)
        node = store(url, lying, local_tier=str(tmp_path / "tier"), trust_unsigned=True)
        assert node.upload(src, KEY, RANK) == {"local-tier": True}  # the probe said "lies"
        assert artifact_names(open_store(url, **options).layer) == []  # not one artifact remotely
        assert node.retract(KEY, RANK, "0" * 64) == []
        assert node.local is not None and node.local.delete_object(NAME)
        assert store(url, options).upload(src, KEY, RANK) == {"store": True}  # honest path
        refused = node.fetch(tmp_path / "b" / KEY, KEY, RANK)
        assert refused.reason == "untrusted" and not (tmp_path / "b" / KEY).exists()
        other = "f" * 64  # another key: the store keeps the first artifact of each
        signer = store(url, options, Keyring(K1))
        assert signer.upload(make_tree(tmp_path / "s" / other), other, RANK) == {"store": True}
        keyed = store(url, lying, Keyring(verify_keys=[K1]), local_tier=str(tmp_path / "tier"))
        assert keyed.fetch(tmp_path / "c" / other, other, RANK).reason == "hit"  # signed: ok
        assert [m for m, _ in proxy.requests if m in {"PUT", "POST", "DELETE"}]  # the probe's


def test_unsigned_local_artifact_is_refused_when_keys_are_set(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    store(str(tmp_path / "s")).upload(src, KEY, RANK)
    keyed = store(str(tmp_path / "s"), keyring=Keyring(verify_keys=[K1]))
    assert keyed.fetch(tmp_path / "b" / KEY, KEY, RANK).reason == "invalid"
    assert not (tmp_path / "b" / KEY / RANK).exists()


def test_tampered_object_in_the_store_is_never_installed(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    shared = store(str(tmp_path / "s"))
    shared.upload(src, KEY, RANK)
    path = tmp_path / "s" / NAME
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    assert shared.fetch(tmp_path / "b" / KEY, KEY, RANK).reason == "invalid"
    assert not (tmp_path / "b" / KEY / RANK).exists()


def test_read_only_node_fetches_and_never_writes_the_store(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str
) -> None:
    url, options = s3(moto_s3, s3_bucket)
    tier = str(tmp_path / "tier")
    src = make_tree(tmp_path / "a" / KEY)
    reader = store(url, options, local_tier=tier, read_only=True, trust_unsigned=True)
    assert reader.upload(src, KEY, RANK) == {"local-tier": True}
    assert artifact_names(open_store(url, **options).layer) == []
    (src / "rank_1_0").mkdir()
    (src / "rank_1_0" / "model").write_bytes(b"rank 1")
    store(url, options).upload(src, KEY, "rank_1_0")
    assert reader.fetch(tmp_path / "b" / KEY, KEY, "rank_1_0").reason == "hit"
    assert reader.fetch(tmp_path / "c" / KEY, KEY, RANK).source == "local-tier"


def test_retract_deletes_only_the_artifact_named(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a" / KEY)
    shared = store(str(tmp_path / "s"))
    shared.upload(src, KEY, RANK)
    assert shared.retract(KEY, RANK, "0" * 64) == []
    assert (tmp_path / "s" / NAME).exists()
    stored = shared.fetch(tmp_path / "b" / KEY, KEY, RANK).manifest
    assert stored is not None
    assert shared.retract(KEY, RANK, stored.digest) == ["store"]
    assert not (tmp_path / "s" / NAME).exists()


# -- uploads: parts, races, kills --------------------------------------------------------------
def _big_tree(tmp_path: Path, name: str) -> Path:
    return make_tree(tmp_path / name / KEY, model=os.urandom(2 * PART_BYTES + 12345))


def _node(url: str, options: dict[str, Any], tree: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(NODE), url, json.dumps(options), str(tree), *extra],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_two_nodes_uploading_at_once_one_wins(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url, options = (str(tmp_path / "s"), {}) if backend == "local" else _remote(backend, request)
    trees = [_big_tree(tmp_path, f"n{i}") for i in range(2)]
    # both upload at once; the first completes while the second is still sending (moto
    # checks If-None-Match and completes a multipart upload without a lock between them, so
    # two completions in the same instant could both pass there; S3 itself is atomic)
    late = _node(url, options, trees[0], "--pause-at-end", "3")
    early = _node(url, options, trees[1])
    assert early.communicate(timeout=120)[0].strip() == "created"
    assert late.communicate(timeout=120)[0].strip() == "kept"
    fetched = store(url, options, trust_unsigned=True).fetch(tmp_path / "x" / KEY, KEY, RANK)
    assert fetched.reason == "hit"
    got = (tmp_path / "x" / KEY / RANK / "model").read_bytes()
    assert got == (trees[1] / RANK / "model").read_bytes()


def test_gcs_single_part_race_one_wins(tmp_path: Path, fake_gcs: FakeGCS, gcs_bucket: str) -> None:
    url, options = gcs(fake_gcs, gcs_bucket)
    trees = [make_tree(tmp_path / f"n{i}" / KEY, model=os.urandom(5000)) for i in range(4)]
    results: list[bool] = []
    barrier = threading.Barrier(len(trees))

    def upload(tree: Path) -> None:
        blobs = open_store(url, **options)
        manifest, chunks = pack(tree, KEY, RANK)
        body = list(chunks)
        barrier.wait(10)
        results.append(blobs.layer.write_object(manifest.name, iter(body)))

    threads = [threading.Thread(target=upload, args=(t,)) for t in trees]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [False, False, False, True]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_upload_killed_mid_stream_stores_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url, options = (str(tmp_path / "s"), {}) if backend == "local" else _remote(backend, request)
    node = _node(url, options, _big_tree(tmp_path, "n"), "--stall-after", str(2 * PART_BYTES + 10))
    assert node.stdout is not None
    assert node.stdout.readline().strip() == "stalled"
    node.send_signal(signal.SIGKILL)
    node.wait(30)
    assert artifact_names(open_store(url, **options).layer) == []
    fetched = store(url, options, trust_unsigned=True).fetch(tmp_path / "x" / KEY, KEY, RANK)
    assert fetched.reason == "miss" and not (tmp_path / "x" / KEY / RANK).exists()


def test_stream_raising_mid_upload_stores_nothing(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str
) -> None:
    url, options = s3(moto_s3, s3_bucket)
    blobs = open_layer(url, **options)
    assert isinstance(blobs, S3Store)

    def broken() -> Any:
        yield b"x" * (2 * PART_BYTES + 1)
        raise RuntimeError("disk went away")

    with pytest.raises(RuntimeError):
        blobs.write_object(NAME, broken())
    assert artifact_names(blobs) == []


def test_gcs_multi_part_round_trip(tmp_path: Path, fake_gcs: FakeGCS, gcs_bucket: str) -> None:
    url, options = gcs(fake_gcs, gcs_bucket)
    src = _big_tree(tmp_path, "a")
    assert isinstance(open_store(url, **options).layer, GCSStore)
    shared = store(url, options, trust_unsigned=True)
    assert shared.upload(src, KEY, RANK) == {"store": True}
    assert shared.fetch(tmp_path / "b" / KEY, KEY, RANK).reason == "hit"
    assert (tmp_path / "b" / KEY / RANK / "model").read_bytes() == (
        src / RANK / "model"
    ).read_bytes()


# -- settings and the exit bound ---------------------------------------------------------------
def test_settings() -> None:
    assert CompileSettings.from_env({}).enabled is False
    assert CompileSettings.from_env({"PLANCACHE_URL": "/x"}).enabled is True
    off = {"PLANCACHE_URL": "/x", "PLANCACHE_COMPILE_CACHE": "0"}
    assert CompileSettings.from_env(off).enabled is False
    assert CompileSettings.from_env({"PLANCACHE_COMPILE_CACHE": "1"}).enabled is True
    s = CompileSettings.from_env({"PLANCACHE_COMPILE_MAX_BYTES": "1000"})
    assert s.max_bytes == 1000 and s.max_bytes < 4 << 30 == CompileSettings().max_bytes
    for bad in (
        {"PLANCACHE_COMPILE_CACHE": "maybe"},
        {"PLANCACHE_COMPILE_MAX_BYTES": "-1"},
        {"PLANCACHE_COMPILE_EXIT_WAIT": "0"},
    ):
        with pytest.raises(ConfigError):
            CompileSettings.from_env(bad)


def test_uploads_wait_is_bounded() -> None:
    uploads = Uploads()
    release = threading.Event()
    uploads.start("model info", release.wait, 30)
    uploads.start("compile artifacts", lambda: None)
    assert uploads.wait(0.2) is False
    assert uploads.unfinished() == ["model info"]
    release.set()
    assert uploads.wait(5) is True
    assert uploads.unfinished() == []


def _remote(backend: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if backend == "s3":
        return s3(request.getfixturevalue("moto_s3"), request.getfixturevalue("s3_bucket"))
    return gcs(request.getfixturevalue("fake_gcs"), request.getfixturevalue("gcs_bucket"))


def test_others_lists_the_artifacts_of_a_rank_under_other_keys_newest_first_and_bounded(
    tmp_path: Path,
) -> None:
    """What a miss is compared with: heads only, of the same rank, never the node's own key,
    at most ``limit``, newest first; a store that cannot be listed gives nothing."""
    shared = store(str(tmp_path / "store"))
    keys = [c * 64 for c in "0123"]
    for n, key in enumerate(keys):
        tree = make_tree(tmp_path / key / key)
        shared.upload(tree, key, RANK, {"n": n}, {"host": f"node-{n}"})
    (tmp_path / "r1" / "rank_1_0").mkdir(parents=True)
    (tmp_path / "r1" / "rank_1_0" / "model").write_bytes(b"x")
    shared.upload(tmp_path / "r1", keys[0], "rank_1_0")
    found = shared.others(keys[1], RANK, limit=2)
    assert [m.labels["n"] for m in found] == [3, 2]  # newest first, keys[1] and rank_1 left out
    assert all(m.labels["n"] != 1 for m in shared.others(keys[1], RANK))
    assert len(shared.others(keys[1], RANK)) == 3
    assert store(str(tmp_path / "missing")).others(keys[1], RANK) == []
