"""Every command, on plans and on compile artifacts, against stores that must not be written
(issue 23): one that ignores write preconditions (``LyingProxy``: the conformance probe finds
it lying), one whose credentials may not write (``FaultyProxy``: HTTP 403 on every write) and
one opened with ``PLANCACHE_READ_ONLY=1``; on S3 (moto), the writing commands also on GCS
(fake-gcs-server). The reading commands still work; the writing ones write nothing and say
why in a line, never with a traceback. The control: through an honest proxy, the same
writing commands write what they should.

A write is any PUT, POST, DELETE or PATCH the proxy in front of the server sees: the probe's
own (under ``PROBE_PREFIX``) are allowed where a probe is how a writing command judges the
store, none at all with ``PLANCACHE_READ_ONLY=1`` or from a reading command. Each check also
compares every object of the bucket, read straight from the server, before and after."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import boto3
import pytest

from plancache import open_store
from plancache._artifacts.manifest import artifact_object_name as artifact_name
from plancache._artifacts.packing import pack
from plancache._backends._remote import PROBE_PREFIX
from plancache._keys import fingerprint, plan_object_name
from plancache.testing import GiB, child_env
from plancache.testing.hostile import WRITES, FaultyProxy, LyingProxy, writes
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3, _Handler
from tests.artifacts.helpers import KEY, make_tree
from tests.cli.helpers import DAY, named_plan, record_bytes, run
from tests.helpers import LOOSE_OPTIONS

PREFIX = "plans"
REFUSALS = ("lying", "write-denied", "read-only")
"""The stores that must not be written (see the module)."""
MESSAGE = {
    "lying": "ignores write preconditions",
    "write-denied": "may not write",
    "read-only": "read-only",
}
"""What a refused write says, per refusal."""
S3_REFUSALS = [pytest.param(("s3", kind), id=f"s3-{kind}") for kind in REFUSALS]
GCS_REFUSALS = [pytest.param(("gcs", "lying"), id="gcs-lying")]
"""On GCS, the refusal specific to it (the ``ifGenerationMatch`` parameter stripped)."""


class Recorder(CountingProxy):
    """A ``CountingProxy`` (in front of a hostile one) that also tells the probe's writes
    from the others by the body too: a GCS upload names its object in the body only."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._seen_lock = threading.Lock()
        self._writes: list[tuple[str, str, bool]] = []

    def handle(self, h: _Handler, body: bytes) -> None:
        if h.command in WRITES:
            probe = PROBE_PREFIX.encode() in body or PROBE_PREFIX in h.path
            with self._seen_lock:
                self._writes.append((h.command, h.path, probe))
        super().handle(h, body)

    def writes(self) -> list[tuple[str, str, bool]]:
        """``(method, path, the probe's)`` of every write so far."""
        with self._seen_lock:
            return list(self._writes)

    def reset(self) -> None:
        super().reset()
        with self._seen_lock:
            self._writes.clear()


@dataclass
class Stock:
    """What the bucket holds before any command runs."""

    fresh: str
    """A plan recorded today (its fingerprint)."""
    old: str
    """A plan whose one observation is 40 days old."""
    bad: str
    """An invalid record (KV cache larger than its baseline)."""
    artifacts: dict[str, str]
    """Compile artifacts of ``KEY`` by rank: ``rank_0_0`` today, ``rank_1_0`` 40 days old,
    ``rank_2_0`` with a byte flipped past its manifest."""


@dataclass
class Refusing:
    """The stocked store behind a proxy that refuses writes one way or another."""

    kind: str
    url: str
    options: dict[str, Any]
    """Storage options that reach the store through ``proxy``."""
    proxy: Recorder
    """In front of the refusal's proxy."""
    objects: Callable[[], dict[str, bytes]]
    """Every object of the bucket but the probe's, with its bytes, straight from the server."""
    stock: Stock
    tmp_path: Path

    def env(self, name: str) -> dict[str, str]:
        """A command's environment: its own fresh local directory (no verdict cached: a
        writing command probes the store itself), read-only where that is the refusal."""
        extra = {"VLLM_CACHE_ROOT": str(self.tmp_path / "roots" / name)}
        if self.kind == "read-only":
            extra["PLANCACHE_READ_ONLY"] = "1"
        return child_env(**extra)

    def run(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``plancache ARGS --storage-options OPTIONS`` (with ``name``'s environment)."""
        return run(*args, "--storage-options", json.dumps(self.options), env=self.env(name))

    def writes(self) -> list[tuple[str, str]]:
        """Every write the proxy saw, the probe's included."""
        return [(method, path) for method, path, _ in self.proxy.writes()]

    def forbidden_writes(self) -> list[tuple[str, str]]:
        """The writes the proxy saw that a writing command may not send: all of them with
        ``PLANCACHE_READ_ONLY=1``, else those not of the probe (outside its prefix)."""
        return [
            (method, path)
            for method, path, probe in self.proxy.writes()
            if self.kind == "read-only" or not probe
        ]


def _s3_objects(endpoint: str, bucket: str) -> dict[str, bytes]:
    """``Refusing.objects`` on moto."""
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for entry in page.get("Contents", []):
            key = entry["Key"]
            if PROBE_PREFIX not in key:
                found[key] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return found


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        data: bytes = response.read()
        return data


def _gcs_objects(endpoint: str, bucket: str) -> dict[str, bytes]:
    """``Refusing.objects`` on fake-gcs-server (its JSON API, one page: a few objects)."""
    listing = json.loads(_get(f"{endpoint}/storage/v1/b/{bucket}/o?maxResults=1000"))
    assert "nextPageToken" not in listing
    names = [item["name"] for item in listing.get("items", [])]
    return {
        name: _get(f"{endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media")
        for name in names
        if PROBE_PREFIX not in name
    }


def _stock(url: str, options: dict[str, Any], tmp_path: Path) -> Stock:
    """Plans, an invalid record and three compile artifacts, written straight to the
    server."""
    store = open_store(url, **options)
    try:
        fresh, old = named_plan("fresh", kv_gib=3), named_plan("old", kv_gib=2, age_days=40)
        for plan in (fresh, old):
            assert store.put(plan)
        bad = fingerprint({"model": "broken"})
        invalid = record_bytes(kv_cache_memory_bytes=3 * GiB)  # kv > baseline
        assert store.layer.write_object(plan_object_name(bad), (invalid,))
        tree = make_tree(tmp_path / "tree" / KEY)
        for rank in ("rank_1_0", "rank_2_0"):
            (tree / rank).mkdir()
            (tree / rank / "model").write_bytes(f"{rank} model".encode() * 50)
        artifacts: dict[str, str] = {}
        for rank, created in (
            ("rank_0_0", None),
            ("rank_1_0", time.time() - 40 * DAY),
            ("rank_2_0", None),
        ):
            manifest, chunks = pack(tree, KEY, rank, labels={"model": "tiny"}, created_at=created)
            data = bytearray(b"".join(chunks))
            if rank == "rank_2_0":
                data[len(data) // 2] ^= 0xFF  # past the manifest: only a full read finds it
            assert store.layer.write_object(manifest.name, (bytes(data),))
            artifacts[rank] = manifest.name
    finally:
        store.close()
    return Stock(fresh.fingerprint, old.fingerprint, bad, artifacts)


@pytest.fixture
def refusing(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Refusing]:
    """A stocked store (``request.param``: backend and refusal) behind the refusal's proxy
    (a counting one for ``read-only``, and for ``honest``: the control)."""
    backend, kind = request.param
    objects: Callable[[], dict[str, bytes]]
    if backend == "s3":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        bucket: str = request.getfixturevalue("s3_bucket")
        upstream, base = moto.endpoint, {}
        objects = functools.partial(_s3_objects, upstream, bucket)
    else:
        gcs: FakeGCS = request.getfixturevalue("fake_gcs")
        bucket = request.getfixturevalue("gcs_bucket")
        upstream, base = gcs.endpoint, {"token": "anon"}
        objects = functools.partial(_gcs_objects, upstream, bucket)
    url = f"{'gs' if backend == 'gcs' else 's3'}://{bucket}/{PREFIX}"
    stock = _stock(url, {**base, **LOOSE_OPTIONS, "endpoint_url": upstream}, tmp_path)
    hostile: CountingProxy
    if kind == "lying":
        hostile = LyingProxy(upstream)
    elif kind == "write-denied":
        hostile = FaultyProxy(upstream, 403, writes)
    else:
        hostile = CountingProxy(upstream)
    with hostile, Recorder(hostile.endpoint) as recorder:
        options = {**base, **LOOSE_OPTIONS, "endpoint_url": recorder.endpoint}
        yield Refusing(kind, url, options, recorder, objects, stock, tmp_path)


def _clean(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The stdout of a command that must exit ``code`` without a traceback."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result.stdout


@pytest.mark.parametrize("refusing", S3_REFUSALS, indirect=True)
def test_reading_commands_work_and_write_nothing(refusing: Refusing) -> None:
    """ls, show (a plan, an artifact), stats and verify: as on any store, without a write
    (not even a probe's)."""
    r, stock = refusing, refusing.stock
    before = r.objects()
    assert len(before) == 6  # two plans, an invalid record, three artifacts

    listed = _clean(r.run("ls", "ls", r.url), 0)
    for fp in (stock.fresh, stock.old):
        assert fp[:12] in listed
    assert stock.bad[:12] in listed and "invalid records" in listed
    for rank in stock.artifacts:
        assert f"{KEY[:12]}/{rank}" in listed
    assert "2 plans, 1 invalid, 3 compile artifacts" in listed

    shown = _clean(r.run("show", "show", stock.fresh[:10], "--url", r.url), 0)
    assert shown.startswith(f"fingerprint  {stock.fresh}")
    manifest = _clean(r.run("show-artifact", "show", f"{KEY[:8]}/rank_0_0", "--url", r.url), 0)
    assert f"key          {KEY}" in manifest and "rank_0_0/model" in manifest

    stats = json.loads(_clean(r.run("stats", "stats", "--json", r.url), 0))
    assert (stats["plans"], stats["invalid"], stats["artifacts"]) == (2, 1, 3)

    verified = _clean(r.run("verify", "verify", r.url), 1)  # findings: exit 1
    assert f"{stock.bad}  kv_cache_memory_bytes" in verified
    assert f"{stock.artifacts['rank_2_0']}  " in verified
    assert "every byte: 1 failed" in verified

    assert r.writes() == []
    assert r.objects() == before


def _refused(result: subprocess.CompletedProcess[str], message: str, name: str) -> None:
    """A write the store refused: exit 1 or 2, no traceback, and a line saying why (the
    error line on stderr for exit 2)."""
    out = result.stdout + result.stderr
    assert "Traceback" not in out, (name, result.stderr)
    assert result.returncode in (1, 2), (name, result.returncode, result.stdout, result.stderr)
    if result.returncode == 2:
        last = result.stderr.splitlines()[-1]
        assert last.startswith("plancache: error: "), (name, result.stderr)
        assert message in last, (name, result.stderr)
    else:
        assert message in out, (name, result.stdout, result.stderr)


def _source(tmp_path: Path) -> Path:
    """A local store to copy from: a new plan, one that dominates the stored ``fresh`` and a
    compile artifact the bucket lacks."""
    src = tmp_path / "src"
    local = open_store(str(src))
    assert local.put(named_plan("copied"))
    assert local.put(named_plan("fresh", kv_gib=4))
    tree = make_tree(tmp_path / "src-tree" / KEY)
    (tree / "rank_3_0").mkdir()
    (tree / "rank_3_0" / "model").write_bytes(b"rank three")
    manifest, chunks = pack(tree, KEY, "rank_3_0")
    assert local.layer.write_object(manifest.name, chunks)
    return src


def _writing_commands(r: Refusing) -> dict[str, tuple[str, ...]]:
    """Each command that writes the store, by name, with what it would write there."""
    return {
        "verify --fix": ("verify", "--fix", r.url),  # an invalid record, a corrupt artifact
        "rm plan": ("rm", r.stock.fresh, "--url", r.url),
        "rm artifact": ("rm", f"{KEY[:8]}/rank_0_0", "--url", r.url),
        "prune": ("prune", "--older-than", "1d", r.url),  # a plan and an artifact 40 days old
        "cp": ("cp", str(_source(r.tmp_path)), r.url),  # two plans and an artifact
    }


@pytest.mark.parametrize("refusing", S3_REFUSALS + GCS_REFUSALS, indirect=True)
def test_writing_commands_write_nothing(refusing: Refusing) -> None:
    """Each command would write (see ``test_an_honest_store_is_written``): here each is
    refused, with its own local directory, so that each probes the store itself."""
    r = refusing
    before = r.objects()
    for name, args in _writing_commands(r).items():
        r.proxy.reset()
        result = r.run(name, *args)
        _refused(result, MESSAGE[r.kind], name)
        assert r.forbidden_writes() == [], name
        assert r.objects() == before, name


@pytest.mark.parametrize("refusing", [pytest.param(("s3", "honest"), id="s3")], indirect=True)
def test_an_honest_store_is_written(refusing: Refusing) -> None:
    """The control: through an honest proxy, each writing command of
    ``test_writing_commands_write_nothing`` succeeds and changes the bucket."""
    r, stock = refusing, refusing.stock
    plan, artifact = plan_object_name, stock.artifacts.__getitem__
    copied = named_plan("copied").fingerprint
    changed: dict[str, set[str]] = {  # the objects each command deletes or creates
        "verify --fix": {plan(stock.bad), artifact("rank_2_0")},
        "rm plan": {plan(stock.fresh)},
        "rm artifact": {artifact("rank_0_0")},
        "prune": {plan(stock.old), artifact("rank_1_0")},
        "cp": {plan(copied), plan(stock.fresh), artifact_name(KEY, "rank_3_0")},
    }
    for name, args in _writing_commands(r).items():
        before = r.objects()
        r.proxy.reset()
        _clean(r.run(name, *args), 0)
        assert r.forbidden_writes() != [], name
        after = r.objects()
        assert set(before) ^ set(after) == {f"{PREFIX}/{n}" for n in changed[name]}, name
