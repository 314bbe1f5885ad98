"""Retraction: a store removes one observation, keeps its tombstone, and no older copy brings
it back (local, S3 on moto, GCS on fake-gcs-server, and the tiered store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import PlanStore, PutOutcome, open_store
from plancache.backends.local import LocalStore
from plancache.backends.tiered import TieredStore
from plancache.inventory import copy, prune
from plancache.plan import Plan
from plancache.testing import GiB, make_plan
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3

GOOD = make_plan(kv=10 * GiB, baseline=60 * GiB)
BAD = make_plan(kv=30 * GiB, baseline=70 * GiB)
FP = GOOD.fingerprint
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


@pytest.fixture(params=["local", "s3", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PlanStore]:
    if request.param == "local":
        s: PlanStore = LocalStore(tmp_path / "store")
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
    after = store.retract(FP, bad, at=1000.0)
    assert after is not None and after.observations == GOOD.observations
    assert [t.observation for t in after.retracted] == [bad.digest]
    assert store.get(FP) == after
    # a stale copy (a node's old local tier, a directory copied long ago) merges back in
    stale = LocalStore(tmp_path / "stale")
    stale.put(GOOD)
    stale.put(BAD)
    assert copy(stale, store).kept == 1
    assert store.put(BAD) is PutOutcome.KEPT
    assert store.get(FP) == after


def test_retracting_the_last_observation_keeps_a_record_of_tombstones_only(
    store: PlanStore,
) -> None:
    store.put(BAD)
    after = store.retract(FP, BAD.observations[0], at=1000.0)
    assert after is not None and after.observations == () and len(after.retracted) == 1
    assert store.put(BAD) is PutOutcome.KEPT  # the stale observation stays out
    assert store.get(FP) == after
    fresh = make_plan(kv=9 * GiB, baseline=50 * GiB)  # a new measurement is welcome
    assert store.put(fresh) is PutOutcome.REPLACED
    stored = store.get(FP)
    assert stored is not None and stored.observations == fresh.observations


def test_retract_on_a_missing_record_writes_nothing(store: PlanStore) -> None:
    assert store.retract(FP, BAD.observations[0]) is None
    assert store.get(FP) is None


def test_prune_forgets_tombstones_of_observations_it_would_prune(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
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
    local = LocalStore(tmp_path / "tier")
    tiered = TieredStore(remote, local=local)
    tiered.put(GOOD)
    tiered.put(BAD)
    after = tiered.retract(FP, BAD.observations[0])
    assert after is not None and after.observations == GOOD.observations
    assert remote.get(FP) == after and local.get(FP) == after


def test_read_only_retracts_the_local_tier_and_never_writes_the_remote(
    s3_proxy: CountingProxy, s3_bucket: str, tmp_path: Path
) -> None:
    remote = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)
    remote.put(GOOD)
    remote.put(BAD)
    local = LocalStore(tmp_path / "tier")
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
    local = LocalStore(tmp_path / "tier")
    tiered = TieredStore(remote, local=local, read_only=True)
    s3_proxy.reset()
    assert tiered.get(FP) == BAD
    tiered.retract(FP, BAD.observations[0])
    found = tiered.find(FP, lambda p: bool(p.observations))  # not usable: asks the remote
    assert found is not None and found.observations == ()
    assert not [m for m, _ in s3_proxy.requests if m in WRITES]
