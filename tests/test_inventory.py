"""plancache._inventory.plans over real stores: a local directory, and S3 on moto."""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import s3fs

from plancache import Plan, fingerprint, open_store
from plancache._inventory import plans as inventory
from plancache._inventory.plans import CopyCounts, Fix
from plancache._keys import Scalar, plan_object_name
from plancache._observation import Observation
from plancache._store import PlanStore
from plancache.testing import GiB, make_plan
from plancache.testing.servers import MotoS3

DAY = 86400.0
NOW = time.time()
BAD = fingerprint({"model": "broken"})
BAD_RECORD = json.dumps(
    {
        "schema": 1,
        "fingerprint": BAD,
        "factors": {"model": "broken"},
        "kv_cache_memory_bytes": 3 * GiB,
        "free_memory_baseline": 2 * GiB,
        "created_at": NOW,
        "producer": {},
    }
).encode()
"""A record whose KV cache exceeds its baseline: invalid."""
NEWER = fingerprint({"model": "newer"})
NEWER_RECORD = b'{"schema": 3, "fingerprint": "%s"}' % NEWER.encode()
"""A record of a schema this version does not read."""
RawWriter = Callable[[str, bytes], None]


def plan(name: str, *, kv: int = GiB, age_days: float = 0, device: str = "H100") -> Plan:
    factors: dict[str, Scalar] = {"model": name, "device_name": device}
    return make_plan(kv, 70 * GiB, factors, created_at=NOW - age_days * DAY)


@dataclass
class Stocked:
    """A store holding three plans (ages 0, 20 and 40 days), ``BAD`` and ``NEWER``."""

    store: PlanStore
    plans: list[Plan]
    root: Path | None = None
    """The directory of a local store."""


def stock(store: PlanStore, write_raw: RawWriter) -> list[Plan]:
    plans = [
        plan("a", kv=3 * GiB),
        plan("b", age_days=20, device="A10G"),
        plan("c", kv=2 * GiB, age_days=40),
    ]
    for p in plans:
        store.put(p)
    write_raw(BAD, BAD_RECORD)
    write_raw(NEWER, NEWER_RECORD)
    return plans


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Stocked]:
    root = tmp_path / "store"
    store = open_store(str(root))

    def write_raw(fp: str, data: bytes) -> None:
        (root / plan_object_name(fp)).write_bytes(data)

    yield Stocked(store, stock(store, write_raw), root)
    store.close()


@pytest.fixture
def s3(moto_s3: MotoS3, s3_bucket: str) -> Iterator[Stocked]:
    store = open_store(f"s3://{s3_bucket}/plans", endpoint_url=moto_s3.endpoint)
    client = s3fs.S3FileSystem(endpoint_url=moto_s3.endpoint, skip_instance_cache=True)

    def write_raw(fp: str, data: bytes) -> None:
        client.pipe(f"{s3_bucket}/plans/{plan_object_name(fp)}", data)

    yield Stocked(store, stock(store, write_raw))
    store.close()


@pytest.fixture(params=["local", "s3"])
def stocked(request: pytest.FixtureRequest) -> Stocked:
    """The stocked local store, then the stocked S3 store."""
    found: Stocked = request.getfixturevalue(request.param)
    return found


def by_fp(plans: list[Plan]) -> list[Plan]:
    return sorted(plans, key=lambda p: p.fingerprint)


def test_scan_reads_and_judges_every_record(stocked: Stocked) -> None:
    entries = inventory.scan(stocked.store)
    fps = sorted([BAD, NEWER, *(p.fingerprint for p in stocked.plans)])
    assert [e.fingerprint for e in entries] == fps
    found = {e.fingerprint: e for e in entries}
    for p in stocked.plans:
        e = found[p.fingerprint]
        assert (e.plan, e.error, e.other_schema, e.invalid) == (p, None, False, False)
        assert e.raw == p.encode()
    bad = found[BAD]
    assert bad.plan is None and bad.invalid and not bad.other_schema and bad.raw == BAD_RECORD
    assert bad.error is not None and "exceeds free_memory_baseline" in bad.error
    newer = found[NEWER]
    assert newer.plan is None and newer.other_schema and not newer.invalid
    assert newer.error is not None and "schema 3" in newer.error
    assert inventory.read_entry(stocked.store, "0" * 64) is None


def test_resolve_names_each_plan_uniquely(local: Stocked) -> None:
    store, [a, b, _] = local.store, local.plans
    assert inventory.resolve(store, [a.fingerprint[:6]]) == [a.fingerprint]
    assert inventory.resolve(store, [f" {b.fingerprint[:8].upper()} "]) == [b.fingerprint]
    both = [b.fingerprint, a.fingerprint[:10], b.fingerprint[:7], BAD[:9]]
    assert inventory.resolve(store, both) == [b.fingerprint, a.fingerprint, BAD]
    unknown = re.escape(f"no plan matches '{'f' * 64}' in {local.root}")
    with pytest.raises(ValueError, match=unknown):
        inventory.resolve(store, [a.fingerprint, "f" * 64])
    for bad in ("../etc/passwd", "", "0" * 65, "xyz"):
        with pytest.raises(ValueError, match="not a fingerprint or a prefix of one"):
            inventory.resolve(store, [bad])


def test_resolve_refuses_an_ambiguous_prefix(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "twins"))
    seen: dict[str, Plan] = {}
    for i in range(17):  # 17 plans: two share a first digit
        p = plan(f"t{i}")
        if p.fingerprint[0] in seen:
            break
        seen[p.fingerprint[0]] = p
    store.put(p)
    store.put(seen[p.fingerprint[0]])
    with pytest.raises(ValueError, match=r"is ambiguous .* it matches 2 plans") as caught:
        inventory.resolve(store, [p.fingerprint[0]])
    assert p.fingerprint[:12] in str(caught.value)
    assert inventory.resolve(store, [p.fingerprint]) == [p.fingerprint]


def test_remove_resolves_every_prefix_first(local: Stocked) -> None:
    store, [a, b, c] = local.store, local.plans
    with pytest.raises(ValueError, match="no plan matches"):
        inventory.remove(store, [a.fingerprint[:10], "f" * 64])
    assert store.get(a.fingerprint) == a
    removed = inventory.remove(store, [a.fingerprint[:10], b.fingerprint])
    assert removed == [(a.fingerprint, True), (b.fingerprint, True)]
    assert sorted(store.iter_fingerprints()) == sorted([c.fingerprint, BAD, NEWER])


def test_verify_reports_and_fix_deletes_only_this_versions_invalid_records(
    stocked: Stocked,
) -> None:
    store = stocked.store
    report = inventory.verify(store)
    assert report.checked == 5 and report.deleted == 0
    assert [(f.entry.fingerprint, f.fix) for f in report.findings] == [(BAD, None)]
    assert [e.fingerprint for e in report.other_schema] == [NEWER]
    assert store.read_raw(BAD) == BAD_RECORD  # no fix, no change

    fixed = inventory.verify(store, fix=True)
    assert [(f.entry.fingerprint, f.fix) for f in fixed.findings] == [(BAD, Fix.DELETED)]
    assert fixed.deleted == 1
    assert store.read_raw(BAD) is None and store.read_raw(NEWER) == NEWER_RECORD
    again = inventory.verify(store, fix=True)
    assert (again.checked, again.findings, again.deleted) == (4, [], 0)


def test_stats(stocked: Stocked) -> None:
    a, _, c = stocked.plans
    s = inventory.stats(stocked.store)
    assert (s.url, s.plans, s.invalid) == (stocked.store.url, 3, 2)
    assert s.bytes == sum(len(p.encode()) for p in stocked.plans) + len(BAD_RECORD + NEWER_RECORD)
    assert (s.oldest, s.newest) == (c.created_at, a.created_at)
    assert list(s.devices.items()) == [("H100", 2), ("A10G", 1)]


def test_stats_of_an_empty_store(tmp_path: Path) -> None:
    s = inventory.stats(open_store(str(tmp_path / "empty")))
    assert (s.plans, s.invalid, s.bytes, s.oldest, s.newest, s.devices) == (0, 0, 0, None, None, {})


def test_copy_merges_into_the_destination(stocked: Stocked, tmp_path: Path) -> None:
    src, dst = stocked.store, open_store(str(tmp_path / "new" / "dst"))
    calls: list[tuple[int, int]] = []
    counts = inventory.copy(src, dst, progress=lambda done, total: calls.append((done, total)))
    assert counts == CopyCounts(created=3, invalid=2)
    assert calls == [(i, 5) for i in range(1, 6)]
    assert by_fp([p for p in map(dst.get, dst.iter_fingerprints()) if p]) == by_fp(stocked.plans)

    better = plan("a", kv=4 * GiB)  # dominates the destination's "a"
    worse = plan("b", kv=GiB // 2, age_days=20, device="A10G")  # dominated by it
    src.put(better)
    dst.put(worse)
    assert inventory.copy(src, dst) == CopyCounts(replaced=1, kept=2, invalid=2)
    assert dst.get(better.fingerprint) == better
    assert dst.get(worse.fingerprint) == stocked.plans[1]


def test_prune_dry_run_then_for_real(local: Stocked) -> None:
    store, [a, b, c], root = local.store, local.plans, local.root
    assert root is not None
    stale = root / f".{plan_object_name(a.fingerprint)}.host.1.abcd.x.tmp"
    live = root / f".{plan_object_name(a.fingerprint)}.host.2.ef01.y.tmp"
    stale.write_bytes(b"{")
    live.write_bytes(b"{")
    os.utime(stale, (NOW - 7200, NOW - 7200))

    dry = inventory.prune(store, 30 * DAY, dry_run=True, now=NOW)
    assert (dry.plans, dry.temp_files, dry.invalid) == ([c], 1, 2)
    assert len(list(store.iter_fingerprints())) == 5 and stale.exists()
    assert inventory.prune(store, 50 * DAY, dry_run=True, now=NOW).plans == []

    done = inventory.prune(store, 10 * DAY, now=NOW)
    assert (by_fp(done.plans), done.temp_files) == (by_fp([b, c]), 1)
    assert sorted(store.iter_fingerprints()) == sorted([a.fingerprint, BAD, NEWER])
    assert not stale.exists() and live.exists()


def test_prune_on_s3_has_no_temp_files(s3: Stocked) -> None:
    result = inventory.prune(s3.store, 30 * DAY, dry_run=True, now=NOW)
    assert (result.plans, result.temp_files, result.invalid) == ([s3.plans[2]], None, 2)
    assert len(list(s3.store.iter_fingerprints())) == 5


def test_entry_dict(local: Stocked) -> None:
    entries = {e.fingerprint: e for e in inventory.scan(local.store)}
    b = local.plans[1]
    row = inventory.entry_dict(entries[b.fingerprint], now=NOW + 5)
    assert row == {
        "fingerprint": b.fingerprint,
        "valid": True,
        "device": "A10G",
        "model": "-",
        "observations": [o.to_dict() for o in b.observations],
        "provisional": [],
        "max_kv_cache_memory_bytes": b.max_kv_cache_memory_bytes,
        "min_free_memory_baseline": b.min_free_memory_baseline,
        "created_at": b.created_at,
        "age_seconds": pytest.approx(20 * DAY + 5),
        "producer": {"host": "test"},
        "labels": {},
        "signed_by": None,
        "signature_error": None,
        "bytes": len(b.encode()),
    }
    bad = inventory.entry_dict(entries[BAD])
    assert bad == {
        "fingerprint": BAD,
        "valid": False,
        "error": bad["error"],
        "bytes": len(BAD_RECORD),
    }
    assert "exceeds" in bad["error"]


def test_prune_drops_old_observations_and_keeps_the_record(stocked: Stocked) -> None:
    store, [a, b, c] = stocked.store, stocked.plans
    old = Observation(GiB, 60 * GiB, NOW - 40 * DAY, {"host": "old"})
    fresh = Observation(2 * GiB, 70 * GiB, NOW - DAY, {"host": "fresh"})
    factors: dict[str, Scalar] = {"model": "mixed"}
    mixed = Plan(fingerprint(factors), factors, (old, fresh), {"model": "mixed"})
    store.put(mixed)

    dry = inventory.prune(store, 30 * DAY, dry_run=True, now=NOW)
    assert (by_fp(dry.plans), dry.observations, dry.deleted) == (by_fp([c, mixed]), 2, 1)
    assert store.get(mixed.fingerprint) == mixed and store.get(c.fingerprint) == c

    done = inventory.prune(store, 30 * DAY, now=NOW)
    assert (done.observations, done.deleted, done.invalid) == (2, 1, 2)
    kept = store.get(mixed.fingerprint)
    assert kept is not None and kept.observations == (fresh,) and kept.labels == mixed.labels
    assert store.get(c.fingerprint) is None
    assert store.get(a.fingerprint) == a and store.get(b.fingerprint) == b


def after_second_read(store: PlanStore, fp: str, write: Callable[[], object]) -> None:
    """Run ``write`` once, right after ``store``'s second read of ``fp`` returns (the first
    is the scan's): another writer landing between the read that judges a record and the
    delete that follows it."""
    read = store._read
    reads = 0

    def then_write(key: str) -> tuple[bytes, object] | None:
        nonlocal reads
        found = read(key)
        reads += key == fp
        if key == fp and reads == 2:
            write()
        return found

    store._read = then_write  # type: ignore[method-assign,assignment]


@pytest.fixture(params=["local", "s3", "gcs"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], PlanStore]]:
    """Opens one store (a new store object each call): local, moto S3, or fake-gcs-server
    behind ``GCSDeletePreconditions``."""
    if request.param == "local":
        yield functools.partial(open_store, str(tmp_path / "store"))
        return
    if request.param == "s3":
        endpoint = request.getfixturevalue("moto_s3").endpoint
        url = f"s3://{request.getfixturevalue('s3_bucket')}/plans"
        yield functools.partial(open_store, url, endpoint_url=endpoint)
        return
    endpoint = request.getfixturevalue("gcs_endpoint")
    url = f"gs://{request.getfixturevalue('gcs_bucket')}/plans"
    yield functools.partial(open_store, url, endpoint_url=endpoint, token="anon")


def test_prune_keeps_an_observation_written_after_it_judged_the_record(
    opener: Callable[[], PlanStore],
) -> None:
    store, writer = opener(), opener()
    old, fresh = plan("m", age_days=40), plan("m", kv=2 * GiB)
    store.put(old)
    after_second_read(store, old.fingerprint, lambda: writer.put(fresh))
    pruned = inventory.prune(store, 30 * DAY, now=NOW)
    assert (pruned.plans, pruned.deleted) == ([old], 0)
    assert store.get(old.fingerprint) == fresh
    store.close()
    writer.close()


def test_verify_fix_keeps_a_record_written_after_it_judged_it(
    opener: Callable[[], PlanStore],
) -> None:
    store, writer = opener(), opener()
    writer.put(plan("other"))  # the bucket or directory exists
    good = make_plan(factors={"model": "broken"})
    assert good.fingerprint == BAD
    store._create(BAD, BAD_RECORD)
    after_second_read(store, BAD, lambda: writer.put(good))
    report = inventory.verify(store, fix=True)
    assert [(f.entry.fingerprint, f.fix) for f in report.findings] == [(BAD, Fix.NOW_VALID)]
    assert store.get(BAD) == good
    store.close()
    writer.close()
