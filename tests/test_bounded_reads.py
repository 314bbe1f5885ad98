"""Every object a kind reads from a store goes through one bounded reader
(``plancache._reader``, the kinds' decoders): one object never fails a command or
a pull, dates past the clock-skew bound take no one's place, an unsigned object is refused
on its bytes before any structure is built where keys are required, every documented limit
holds while parsing, per-kind caps hold, a pull ends within its bound over any backend, and
what a store says reaches a log escaped."""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging
import os
import sys
import tarfile
import threading
import time
import tracemalloc
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest

from plancache import PlanCache, PlanStore, Reason, open_store, register_backend
from plancache._artifacts import modelinfo, reports
from plancache._artifacts.manifest import MANIFEST_NAME, Manifest
from plancache._backends.local import LocalStore
from plancache._backends.tiered import TieredStore
from plancache._signing import Keyring
from plancache.caches import CacheShare, directory_cache
from plancache.errors import ArtifactError, InvalidPlanError, PlanStorePermissionError
from plancache.integrations import torch as mega
from plancache.integrations import triton
from plancache.integrations.vllm.compile_miss import name_miss
from plancache.testing import GiB, child_env, make_plan, plan_object_name
from plancache.testing.servers import MotoS3
from tests.artifacts.helpers import KEY, RANK, artifact_store, make_tree
from tests.cli.helpers import run
from tests.test_registry import MemLayer

SIGNING = "bounded-reads-" + "k" * 24
GENUINE = {"plans": {"hit": 1}}


def _report(created: float, keyring: Keyring | None = None) -> reports.Report:
    return reports.Report(
        created, {"host": "node"}, GENUINE, {}, uuid.uuid4().hex, None
    ).signed_with(keyring or Keyring())


def _planted(root: Path, count: int, created: float) -> None:
    """``count`` unsigned, well-formed reports dated ``created``, written past every check."""
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(count):
        fake = reports.Report(created, {}, {"planted": {"hit": 1}}, {}, uuid.uuid4().hex)
        (root / fake.name).write_bytes(fake.encode())


def _stats(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run("stats", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    booted: dict[str, Any] = json.loads(result.stdout)["boot_reports"]
    return booted


# -- item 6: far-future and unsigned reports hide nothing ------------------------------------
def test_far_future_unsigned_reports_do_not_hide_the_genuine_one(tmp_path: Path) -> None:
    """1,000 unsigned reports dated in year 2286 filled every one of stats' "newest 1,000"
    slots (``stored 1001, read 0`` of the genuine kind). They are left out, counted."""
    root = tmp_path / "store"
    _planted(root, reports.MAX_READ, 9_999_999_999.0)
    genuine = _report(time.time())
    (root / genuine.name).write_bytes(genuine.encode())
    booted = _stats(str(root))
    assert (booted["stored"], booted["read"]) == (reports.MAX_READ + 1, 1)
    assert set(booted["kinds"]) == {"plans"} and booted["future"] == reports.MAX_READ


def test_with_keys_unsigned_reports_take_no_place_before_their_signature_is_checked(
    tmp_path: Path,
) -> None:
    """With keys, 1,000 unsigned reports dated now (newer than the signed one) took every
    slot: the newest 1,000 names were chosen first, their signatures checked after."""
    root = tmp_path / "store"
    genuine = _report(time.time() - 60, Keyring(SIGNING))
    root.mkdir()
    (root / genuine.name).write_bytes(genuine.encode())
    _planted(root, reports.MAX_READ, time.time())
    booted = _stats(str(root), env=child_env(PLANCACHE_VERIFY_KEYS=SIGNING))
    assert (booted["stored"], booted["read"]) == (reports.MAX_READ + 1, 1)
    assert set(booted["kinds"]) == {"plans"}


def test_an_unsigned_envelope_is_refused_on_its_bytes_where_keys_are_required() -> None:
    """A boot report or a model info no accepted key signed is refused before its fields
    are judged (the signature first); a signed one decodes."""
    keys = Keyring(verify_keys=[SIGNING])
    file = {"hash": "0" * 64, "modelinfo": {}}
    info = modelinfo.made("0.33.0", "m", "C", file, Keyring())
    for decode, unsigned in [
        (reports.Report.decode, _report(time.time()).encode()),
        (modelinfo.ModelInfo.decode, info.encode()),
    ]:
        with pytest.raises(ArtifactError, match="invalid:signature"):
            decode(unsigned, keys)
    signed = _report(time.time(), Keyring(SIGNING))
    assert reports.Report.decode(signed.encode(), keys) == signed


# -- item 7: one unreadable object fails no command ------------------------------------------
def test_a_glacier_report_or_artifact_fails_neither_stats_nor_ls_nor_cp(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """One ``boot_report_*`` object in the GLACIER class (every GET: 403 InvalidObjectState)
    made ``plancache stats`` exit 2, and a compile artifact or a plan so stored ``ls``,
    ``stats`` and ``cp``. Each is skipped and counted; the genuine report is read."""
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint)
    frozen = _report(time.time())
    client.put_object(
        Bucket=s3_bucket, Key=f"p/{frozen.name}", Body=frozen.encode(), StorageClass="GLACIER"
    )
    genuine = _report(time.time() - 5)
    client.put_object(Bucket=s3_bucket, Key=f"p/{genuine.name}", Body=genuine.encode())
    artifact = f"compile_artifact_{KEY}_{RANK}.tar"
    client.put_object(Bucket=s3_bucket, Key=f"p/{artifact}", Body=b"x", StorageClass="GLACIER")
    plan = plan_object_name("a" * 64)
    client.put_object(Bucket=s3_bucket, Key=f"p/{plan}", Body=b"{}", StorageClass="GLACIER")
    options = ["--storage-options", json.dumps({"endpoint_url": moto_s3.endpoint})]
    url = f"s3://{s3_bucket}/p"
    booted = _stats(url, *options)
    assert (booted["stored"], booted["read"], booted["unreadable"]) == (2, 1, 1)
    listed = run("ls", url, *options)
    assert listed.returncode == 0, listed.stderr
    assert f"unreadable here compile artifact {artifact}" in listed.stdout
    assert f"unreadable plan {'a' * 12}: unreadable here: kept" in listed.stdout
    copied = run("cp", url, str(tmp_path / "copy"), *options)
    assert copied.returncode == 0, copied.stderr
    assert f"skipped compile artifact {artifact}: unreadable here" in copied.stdout


def test_a_plan_the_store_does_not_hand_over_is_read_through_the_reader(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Plans are read through the one bounded reader (``plancache._reader.read``): a record
    in the GLACIER class is named once per process however often it is looked up (escaped,
    with the object's name), and a lookup of it, also through a local tier, misses with
    ``store-error``. Before, the plans kind read past the reader: never named."""
    plan = make_plan(factors={"model": "glacier", "n": uuid.uuid4().hex})
    boto3.client("s3", endpoint_url=moto_s3.endpoint).put_object(
        Bucket=s3_bucket,
        Key=f"p/{plan_object_name(plan.fingerprint)}",
        Body=plan.encode(),
        StorageClass="GLACIER",
    )
    caplog.set_level(logging.WARNING, "plancache")
    store = open_store(f"s3://{s3_bucket}/p", endpoint_url=moto_s3.endpoint)
    tiered = TieredStore(store, local=PlanStore(LocalStore(tmp_path / "tier")))
    with pytest.raises(PlanStorePermissionError):
        store.get(plan.fingerprint)
    for cache in (PlanCache(store, timeout=30), PlanCache(tiered, timeout=30)) * 2:
        decision = cache.lookup(plan.factors, 100 * GiB)
        assert decision.reason == Reason.STORE_ERROR and decision.kv_cache_memory_bytes is None
    named = [r for r in caplog.records if "does not hand it over" in r.getMessage()]
    assert len(named) == 1 and plan_object_name(plan.fingerprint) in named[0].getMessage()


@pytest.mark.parametrize("entry", ["directory", "fifo", "link"])
def test_an_odd_entry_under_a_kinds_name_fails_neither_stats_nor_ls(
    tmp_path: Path, entry: str
) -> None:
    """A directory, FIFO or link named like a boot report (or an artifact) in a shared
    local store made ``stats`` and ``ls`` exit 2."""
    root = tmp_path / "store"
    genuine = _report(time.time() - 5)
    root.mkdir()
    (root / genuine.name).write_bytes(genuine.encode())
    names = [_report(time.time()).name, f"compile_artifact_{KEY}_{RANK}.tar"]
    for name in names:
        odd = root / name
        if entry == "directory":
            odd.mkdir()
        elif entry == "fifo":
            os.mkfifo(odd)
        else:
            odd.symlink_to(root / genuine.name)
    booted = _stats(str(root))
    assert (booted["stored"], booted["read"], booted["unreadable"]) == (2, 1, 1)
    listed = run("ls", str(root))
    assert listed.returncode == 0, listed.stderr
    assert f"unreadable here compile artifact {names[1]}" in listed.stdout


# -- item 8: bounded parsing, the signature first --------------------------------------------
def _hostile_manifest(paths: int, depth: int) -> bytes:
    """An unsigned bundle manifest of ``paths`` paths ``depth`` directories deep, each in a
    directory of its own (no directory prefix shared)."""
    files = [
        {
            "path": f"{i:05d}/" + "a/" * (depth - 1) + "f",
            "size": 1,
            "sha256": "0" * 64,
            "mode": 0o644,
        }
        for i in range(paths)
    ]
    body = {
        "format": 1,
        "kind": "regtest",
        "key": "ab" * 32,
        "rank": "",
        "files": files,
        "created_at": time.time(),
        "producer": {},
        "labels": {},
    }
    return orjson.dumps(body)


def _peak(work: Any) -> tuple[int, Any]:
    """The peak bytes traced while ``work()`` ran, and what it raised or returned."""
    tracemalloc.start()
    try:
        try:
            got = work()
        except Exception as exc:
            got = exc
        return tracemalloc.get_traced_memory()[1], got
    finally:
        tracemalloc.stop()


DEEP = _hostile_manifest(300, 400)
"""240 KB: the old decode built 120,000 distinct directory prefixes of ~400 characters."""
BOUND = 16 << 20
"""Peak bytes a refusal of ``DEEP`` may take (the old decode: over 50 MiB)."""


def test_a_manifest_deeper_than_32_directories_is_refused_before_building_structure() -> None:
    peak, got = _peak(lambda: Manifest.decode(DEEP))
    assert isinstance(got, InvalidPlanError) and "directories deep" in str(got), got
    assert peak < BOUND, peak
    legal = _hostile_manifest(1, 32)
    assert Manifest.decode(legal).files[0].path.count("/") == 32
    with pytest.raises(InvalidPlanError, match="directories deep"):
        Manifest.decode(_hostile_manifest(1, 33))


def test_a_path_that_is_also_a_directory_is_found_without_listing_directories() -> None:
    """20,000 distinct paths 31 directories deep (legal): the old decode built every
    directory prefix (620,000 strings: 32 MB past the parse's own peak, for a 3.5 MB
    manifest); the sorted paths take no more than the parse did."""
    files = [
        {"path": f"{i:05d}/" + "a/" * 30 + "f", "size": 1, "sha256": "0" * 64, "mode": 0o644}
        for i in range(19_999)
    ]
    files.append({"path": "00001/a", "size": 1, "sha256": "0" * 64, "mode": 0o644})
    body = {"format": 1, "kind": "regtest", "key": "ab" * 32, "rank": "", "files": files}
    data = orjson.dumps({**body, "created_at": 1.0, "producer": {}, "labels": {}})
    parsing, _ = _peak(lambda: orjson.loads(data))
    peak, got = _peak(lambda: Manifest.decode(data))
    assert isinstance(got, InvalidPlanError) and "also a directory" in str(got), got
    assert peak < parsing + 2 * len(data), (peak, parsing, len(data))


def _bundle(manifest: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    return out.getvalue()


def test_with_keys_a_pull_refuses_a_hostile_manifest_on_its_signature_first(
    tmp_path: Path,
) -> None:
    """A key-holding pull spent seconds of CPU and hundreds of MiB on an unsigned bundle
    manifest before its signature was looked at; now it is refused on its bytes."""
    store = tmp_path / "store"
    store.mkdir()
    cache = directory_cache("regtest", tmp_path / "cache", {"compiler": "t"})
    (store / f"cache_regtest_{cache.scope}_{'0' * 32}.tar").write_bytes(_bundle(DEEP))
    env = {"PLANCACHE_URL": str(store), "PLANCACHE_SIGNING_KEY": SIGNING}
    with CacheShare.from_env({**env, "VLLM_CACHE_ROOT": str(tmp_path / "v")}) as share:
        peak, pulled = _peak(lambda: share.pull(cache))
    assert pulled.reason == "invalid" and pulled.bundles == 0, pulled
    assert peak < BOUND, peak


# -- item 9: what a store says is logged escaped ---------------------------------------------
HOSTILE_TEXT = "x\n2026 WARNING plancache: forged\x1b[2J"


def test_a_compile_miss_compares_only_signed_artifacts_with_keys_and_logs_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path / "store")
    labels: dict[str, object] = {"model": "m", "factors": {HOSTILE_TEXT: 1, "b": 2}}
    artifact_store(url).upload(
        make_tree(tmp_path / "tree"), KEY, RANK, labels, {"host": HOSTILE_TEXT}
    )
    other = "d" * 64
    caplog.set_level(logging.INFO, "plancache")
    name_miss(lambda: artifact_store(url, Keyring(SIGNING)), other, RANK, {"b": 3}, "m")
    assert "forged" not in caplog.text  # unsigned: not compared where keys are set
    name_miss(lambda: artifact_store(url), other, RANK, {"b": 3}, "m")
    [line] = [r.getMessage() for r in caplog.records if "nearest stored" in r.getMessage()]
    assert "forged" in line and "\n" not in line and "\x1b" not in line, line


def test_triton_group_names_are_logged_escaped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "plancache")
    assert triton.report_rebuilt([f"k/__grp__{HOSTILE_TEXT}.json"], 1) == 1
    [line] = [r.getMessage() for r in caplog.records if "kernels compiled" in r.getMessage()]
    assert "forged" in line and "\n" not in line and "\x1b" not in line, line


# -- item 11: the mega-cache's 64 ------------------------------------------------------------
def test_the_mega_cache_hands_torch_at_most_64_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """70 bundles stored under one name: ``load`` handed torch all 70 (its docs: 64)."""
    version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "2.13.0" if name in ("torch", "triton") else version(name),
    )
    handed: list[bytes] = []

    def load_cache_artifacts(data: bytes) -> int:
        handed.append(data)
        return 1

    compiler = types.SimpleNamespace(load_cache_artifacts=load_cache_artifacts)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(compiler=compiler))
    env = {
        "PLANCACHE_URL": str(tmp_path / "store"),
        "PLANCACHE_SIGNING_KEY": SIGNING,
        "VLLM_CACHE_ROOT": str(tmp_path / "v"),
    }
    with CacheShare.from_env(env) as share:
        for i in range(70):
            assert mega.save("prog", f"blob {i}".encode(), gpu="none", share=share).written
        loaded = mega.load("prog", gpu="none", share=share)
    assert loaded.reason == "hit" and len(handed) == loaded.loaded <= 64, loaded


# -- item 12: a pull ends within its bound over a registered backend -------------------------
class StallLayer(MemLayer):
    """A registered third party's layer whose every call stalls until ``RELEASE`` is set
    (at most 10 s, then ``TimeoutError``)."""

    ENTERED = threading.Event()
    RELEASE = threading.Event()

    def _check(self) -> None:
        StallLayer.ENTERED.set()
        if not StallLayer.RELEASE.wait(10):
            raise TimeoutError("stalled")


register_backend("stalltest", StallLayer)


@pytest.fixture
def stalling() -> Iterator[None]:
    StallLayer.ENTERED.clear()
    StallLayer.RELEASE.clear()
    yield
    StallLayer.RELEASE.set()


def test_a_pull_over_a_stalling_registered_backend_ends_within_its_bound(
    tmp_path: Path, stalling: None
) -> None:
    """``PLANCACHE_COMPILE_TIMEOUT=1``: the pull was held by the stalled calls (8 s in the
    report, ``miss``). It returns while the backend still stalls, with ``timeout``."""
    env = {
        "PLANCACHE_URL": f"stalltest://{uuid.uuid4().hex}/p",
        "PLANCACHE_SIGNING_KEY": SIGNING,
        "PLANCACHE_COMPILE_TIMEOUT": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "v"),
    }
    share = CacheShare.from_env(env)
    pulled = share.pull(directory_cache("regtest", tmp_path / "cache", {"compiler": "t"}))
    assert StallLayer.ENTERED.is_set() and not StallLayer.RELEASE.is_set()
    assert pulled.reason == "timeout" and pulled.seconds < 10, pulled
    StallLayer.RELEASE.set()
    share.close()


def test_model_info_and_boot_reports_end_within_their_bound_over_a_stalling_backend(
    tmp_path: Path, stalling: None, caplog: pytest.LogCaptureFixture
) -> None:
    """``PLANCACHE_COMPILE_TIMEOUT=1``: the model-info fetch and upload and the boot report's
    upload were held by the stalled calls until those failed (10 s here, ``store-error``;
    for ever where a call never returns). Each returns while the backend still stalls,
    saying ``timeout``; the fetch left running installs nothing."""
    env = {
        "PLANCACHE_URL": f"stalltest://{uuid.uuid4().hex}/p",
        "PLANCACHE_SIGNING_KEY": SIGNING,
        "PLANCACHE_COMPILE_TIMEOUT": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "v"),
    }
    caplog.set_level(logging.WARNING, "plancache")
    keys = Keyring(SIGNING)
    info = modelinfo.made("0.33.0", "m", "C", {"hash": "ab" * 16, "modelinfo": {}}, keys)
    with CacheShare.from_env(env) as share:
        artifacts = share._artifacts
        target = tmp_path / "modelinfos" / "m-C.json"
        fetched = artifacts.fetch_model_info(info.name, info.module_hash, target)
        assert fetched.reason == "timeout" and fetched.seconds < 10, fetched
        assert StallLayer.ENTERED.is_set() and not StallLayer.RELEASE.is_set()
        assert "store" not in artifacts.upload_model_info(info)  # the local tier still is
        assert "store" not in artifacts.upload_report(_report(time.time(), keys))
        assert not StallLayer.RELEASE.is_set()
        StallLayer.RELEASE.set()
    said = [r.getMessage() for r in caplog.records if r.getMessage().endswith(": timeout")]
    assert [m.split(" ")[1:3] for m in said] == [
        ["model", "info"],
        ["model", "info:"],
        ["boot", "report:"],
    ], said
    assert not target.exists()
