"""Retraction: a store removes one observation, keeps its tombstone, and no older copy brings
it back (local, S3 on moto, GCS on fake-gcs-server, and the tiered store)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import PlanCache, PlanStore, PutOutcome, open_store
from plancache._backends.local import LocalStore
from plancache._backends.tiered import TieredStore
from plancache._defaults import TOMBSTONE_SKEW_S
from plancache._inventory.plans import copy, prune
from plancache._observation import MAX_CREATED_AT, Tombstone
from plancache._plan import MAX_TOMBSTONES, Plan
from plancache._store import Retraction
from plancache.testing import FACTORS, GiB, make_plan
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3

GOOD = make_plan(kv=10 * GiB, baseline=60 * GiB)
BAD = make_plan(kv=30 * GiB, baseline=70 * GiB)
FP = GOOD.fingerprint
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


@pytest.fixture(params=["local", "s3", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PlanStore]:
    if request.param == "local":
        s: PlanStore = PlanStore(LocalStore(tmp_path / "store"))
    elif request.param == "s3":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        bucket = request.getfixturevalue("s3_bucket")
        s = open_store(f"s3://{bucket}/plans", endpoint_url=moto.endpoint)
    else:
        gcs: FakeGCS = request.getfixturevalue("fake_gcs")
        bucket = request.getfixturevalue("gcs_bucket")
        s = open_store(f"gs://{bucket}/plans", endpoint_url=gcs.endpoint, token="anon")
    yield s
    s.close()


def test_retract_removes_only_that_observation_and_keeps_a_tombstone(
    store: PlanStore, tmp_path: Path
) -> None:
    store.put(GOOD)
    store.put(BAD)
    bad = BAD.observations[0]
    done = store.retract(FP, bad, at=1000.0)
    after = done.record
    assert done.removed and after is not None and after.observations == GOOD.observations
    assert [t.observation for t in after.retracted] == [bad.digest]
    assert store.get(FP) == after
    # a stale copy (a node's old local tier, a directory copied long ago) merges back in
    stale = PlanStore(LocalStore(tmp_path / "stale"))
    stale.put(GOOD)
    stale.put(BAD)
    assert copy(stale, store).kept == 1
    assert store.put(BAD) is PutOutcome.KEPT
    assert store.get(FP) == after


def test_retracting_the_last_observation_keeps_a_record_of_tombstones_only(
    store: PlanStore,
) -> None:
    store.put(BAD)
    after = store.retract(FP, BAD.observations[0], at=1000.0).record
    assert after is not None and after.observations == () and len(after.retracted) == 1
    assert store.put(BAD) is PutOutcome.KEPT  # the stale observation stays out
    assert store.get(FP) == after
    fresh = make_plan(kv=9 * GiB, baseline=50 * GiB)  # a new measurement is welcome
    assert store.put(fresh) is PutOutcome.REPLACED
    stored = store.get(FP)
    assert stored is not None and stored.observations == fresh.observations


def test_retract_on_a_missing_record_writes_nothing(store: PlanStore) -> None:
    assert store.retract(FP, BAD.observations[0]) == Retraction(None, removed=False)
    assert store.get(FP) is None


def planted(dated: float) -> Plan:
    """GOOD and BAD's observations with ``MAX_TOMBSTONES`` tombstones of other observations,
    all retracted at ``dated``: what a node with a clock far ahead, or a writer planting
    them, leaves in a store."""
    junk = tuple(Tombstone(f"{n:064x}", 1.0, dated) for n in range(MAX_TOMBSTONES))
    both = (*GOOD.observations, *BAD.observations)
    return Plan(FP, GOOD.factors, both, retracted=junk)


@pytest.mark.parametrize("far", [True, False], ids=["year-9999", "half-a-day-ahead"])
def test_a_retraction_takes_effect_whatever_tombstones_the_record_holds(
    store: PlanStore, far: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """32 tombstones dated in year 9999 (past the skew bound: dropped) or half a day ahead
    (within it: they outrank the retraction, and the lowest-ranked one makes room)."""
    dated = MAX_CREATED_AT if far else time.time() + TOMBSTONE_SKEW_S / 2
    assert store.put(planted(dated)) is PutOutcome.CREATED
    bad = BAD.observations[0]
    caplog.set_level(logging.INFO, logger="plancache")
    assert PlanCache(store, timeout=10.0).retract(FP, bad)
    assert "plancache: retracted fp=" in caplog.text
    stored = store.get(FP)
    assert stored is not None and stored.observations == GOOD.observations
    assert bad.digest in {t.observation for t in stored.retracted}
    assert len(stored.retracted) == (1 if far else MAX_TOMBSTONES)
    decision = PlanCache(store, timeout=10.0).lookup(FACTORS, current_free_memory=80 * GiB)
    assert decision.observation == GOOD.observations[0]  # the next node does not apply BAD
    assert store.put(BAD) is PutOutcome.KEPT  # nor does a stale copy bring it back


def test_a_write_drops_tombstones_dated_past_the_skew_bound(store: PlanStore) -> None:
    store.put(planted(MAX_CREATED_AT))
    assert store.put(make_plan(kv=11 * GiB, baseline=60 * GiB)) is PutOutcome.REPLACED
    stored = store.get(FP)
    assert stored is not None and stored.retracted == ()


def test_a_retraction_that_changed_nothing_says_so(
    store: PlanStore, caplog: pytest.LogCaptureFixture
) -> None:
    cache = PlanCache(store, timeout=10.0)
    caplog.set_level(logging.INFO, logger="plancache")
    assert not cache.retract(FP, BAD.observations[0])
    assert "changed nothing" in caplog.text and "no record of that key" in caplog.text
    assert store.get(FP) is None
    store.put(GOOD)
    caplog.clear()
    assert not cache.retract(FP, BAD.observations[0])
    assert "changed nothing" in caplog.text and "no such observation" in caplog.text
    assert "plancache: retracted" not in caplog.text
    stored = store.get(FP)  # the tombstone is still written: no stale copy brings BAD in
    assert stored is not None and stored.observations == GOOD.observations
    assert [t.observation for t in stored.retracted] == [BAD.observations[0].digest]
    again = store.retract(FP, BAD.observations[0])
    assert not again.removed and again.record is not None
    assert again.record.observations == GOOD.observations


def test_prune_forgets_tombstones_of_observations_it_would_prune(tmp_path: Path) -> None:
    store = PlanStore(LocalStore(tmp_path))
    old = make_plan(kv=30 * GiB, baseline=70 * GiB)
    store.put(old)
    store.retract(FP, old.observations[0], at=old.created_at + 1)
    kept = prune(store, older_than=3600.0)
    assert (kept.deleted, store.get(FP) is not None) == (0, True)
    result = prune(store, older_than=0.0, now=old.created_at + 10)
    assert result.deleted == 1 and store.get(FP) is None


def test_tiered_store_retracts_remote_and_local_tier(
    s3_proxy: CountingProxy, s3_bucket: str, tmp_path: Path
) -> None:
    remote = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)
    local = PlanStore(LocalStore(tmp_path / "tier"))
    tiered = TieredStore(remote, local=local)
    tiered.put(GOOD)
    tiered.put(BAD)
    after = tiered.retract(FP, BAD.observations[0]).record
    assert after is not None and after.observations == GOOD.observations
    assert remote.get(FP) == after and local.get(FP) == after


def test_read_only_retracts_the_local_tier_and_never_writes_the_remote(
    s3_proxy: CountingProxy, s3_bucket: str, tmp_path: Path
) -> None:
    remote = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)
    remote.put(GOOD)
    remote.put(BAD)
    local = PlanStore(LocalStore(tmp_path / "tier"))
    tiered = TieredStore(remote, local=local, read_only=True)
    assert tiered.get(FP) is not None  # backfills the local tier
    s3_proxy.reset()
    tiered.retract(FP, BAD.observations[0])
    assert s3_proxy.requests == []
    held = local.get(FP)
    assert held is not None and held.observations == GOOD.observations
    assert tiered.get(FP) == held  # the local tier's record now answers
    assert not [m for m, _ in s3_proxy.requests if m in WRITES]
    remote_plan = remote.get(FP)
    assert isinstance(remote_plan, Plan) and len(remote_plan.observations) == 2


def test_a_read_only_node_keeps_its_local_tombstone_when_it_reads_the_remote_again(
    s3_proxy: CountingProxy, s3_bucket: str, tmp_path: Path
) -> None:
    remote = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)
    remote.put(BAD)
    local = PlanStore(LocalStore(tmp_path / "tier"))
    tiered = TieredStore(remote, local=local, read_only=True)
    s3_proxy.reset()
    assert tiered.get(FP) == BAD
    tiered.retract(FP, BAD.observations[0])
    found = tiered.find(FP, lambda p: bool(p.observations))  # not usable: asks the remote
    assert found is not None and found.observations == ()
    assert not [m for m, _ in s3_proxy.requests if m in WRITES]
