"""Layers that wrap another (``ForwardingLayer``): a lazily opened layer is the layer it
opened, overrides included; a write guard and a read-only view reach what they wrap through
its public methods; the plans kind on them (a tier in front) behaves as on the bare layer.
Real stores only: local directories, moto behind a lying proxy."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from plancache import PlanCache, PlanStore, PutOutcome, open_store
from plancache._backends._remote import PROBE_PREFIX, RemoteStore
from plancache._backends.guarded import GuardedStore, StoreIgnoresPreconditionsError
from plancache._backends.lazy import LazyStore
from plancache._backends.local import LocalStore
from plancache._backends.tiered import ReadOnlyLayer, TieredStore
from plancache._backends.verdicts import VerdictCache
from plancache._forwarding import ForwardingLayer
from plancache._keys import plan_object_name
from plancache.errors import PlanStoreError, PlanStoreUnavailableError
from plancache.testing import GiB, make_plan
from plancache.testing.hostile import LyingProxy
from plancache.testing.servers import MotoS3

GOOD = make_plan(kv=10 * GiB, baseline=70 * GiB)
BAD = make_plan(kv=20 * GiB, baseline=75 * GiB)  # no point dominates the other
FP = GOOD.fingerprint
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


def tiers(tmp_path: Path, *, read_only: bool = False) -> tuple[PlanStore, PlanStore, TieredStore]:
    remote, local = (
        PlanStore(LocalStore(tmp_path / "remote")),
        PlanStore(LocalStore(tmp_path / "tier")),
    )
    return remote, local, TieredStore(remote, local=local, read_only=read_only)


def test_a_tier_retracts_through_a_lazily_opened_remote(tmp_path: Path) -> None:
    """The crash-loop breaker's retraction through a tiered store whose remote layer opens
    on first use reaches both tiers: a node's own lookups read the local one first."""
    remote = PlanStore(LazyStore("remote", lambda: LocalStore(tmp_path / "remote")))
    local = PlanStore(LocalStore(tmp_path / "tier"))
    tiered = TieredStore(remote, local=local)
    assert [tiered.put(GOOD), tiered.put(BAD)] == [PutOutcome.CREATED, PutOutcome.REPLACED]
    done = tiered.retract(FP, BAD.observations[0])
    assert done.removed and done.record is not None
    for store in (remote, local):
        held = store.get(FP)
        assert held is not None and held.observations == GOOD.observations, store


def test_a_read_only_tiered_store_writes_its_local_tier_only(tmp_path: Path) -> None:
    remote, local, tiered = tiers(tmp_path, read_only=True)
    assert tiered.put_merged(GOOD) == (PutOutcome.CREATED, GOOD)
    assert tiered.rewrite(FP, lambda p: p) == GOOD
    assert local.get(FP) == GOOD and remote.get(FP) is None
    with pytest.raises(PlanStoreError, match="read-only"):
        tiered.layer.write_object("x", [b"1"])  # the layer kinds write: read-only too


def test_a_cache_opened_by_a_factory_retracts_from_both_tiers(tmp_path: Path) -> None:
    remote, local, tiered = tiers(tmp_path)
    cache = PlanCache(lambda: tiered, timeout=10.0)
    assert cache.store is tiered  # opened through a LazyStore
    for plan in (GOOD, BAD):
        cache.store.put(plan)
    assert cache.retract(FP, BAD.observations[0])
    assert local.get(FP) == remote.get(FP)
    held = local.get(FP)
    assert held is not None and held.observations == GOOD.observations


def test_a_lazy_store_waits_a_bound_then_opens_later_and_retries_failures(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    failures = [PlanStoreError("no bucket yet")]

    def opener() -> LocalStore:
        if failures:
            raise failures.pop()
        release.wait(10)
        return LocalStore(tmp_path)

    lazy = LazyStore("file:///slow", opener, open_timeout=0.2)
    plans = PlanStore(lazy)
    assert lazy.url == "file:///slow" and repr(lazy) == "LazyStore('file:///slow')"
    with pytest.raises(PlanStoreError, match="no bucket yet"):
        plans.get(FP)
    with pytest.raises(PlanStoreUnavailableError, match=r"did not open within 0\.2 s"):
        plans.get(FP)  # the next use tries again, and waits at most its bound
    release.set()
    assert lazy.start().join(5)
    assert plans.put(GOOD) is PutOutcome.CREATED and lazy.url == str(tmp_path)


def test_forwarding_layers_reach_the_object_layer_beneath(tmp_path: Path) -> None:
    remote, _, tiered = tiers(tmp_path, read_only=True)
    remote.put(GOOD)
    for layer in (tiered.layer, LazyStore("x", lambda: remote.layer)):
        assert isinstance(layer, ForwardingLayer) and not isinstance(layer, PlanStore)
        assert list(layer.list_objects("")) == list(remote.layer.list_objects(""))
        name = plan_object_name(GOOD.fingerprint)
        assert layer.read_object(name, 1 << 20) == remote.layer.read_object(name, 1 << 20)
    assert isinstance(tiered.layer, ReadOnlyLayer)


def test_a_lazily_opened_guard_refuses_every_write_to_a_lying_store(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """Behind a proxy that strips write preconditions: the probe finds the store lying, and
    nothing more is written through the guard, not even a put the record already covers."""
    url = f"s3://{s3_bucket}/plans"
    open_store(url, endpoint_url=moto_s3.endpoint).put(GOOD)
    with LyingProxy(moto_s3.endpoint) as proxy:

        def opener() -> GuardedStore:
            store = open_store(url, endpoint_url=proxy.endpoint).layer
            assert isinstance(store, RemoteStore)
            return GuardedStore(store, VerdictCache(tmp_path))

        lazy = PlanStore(LazyStore(url, opener, open_timeout=30.0))
        assert lazy.get(FP) == GOOD
        for write in (
            lambda: lazy.put(GOOD),
            lambda: lazy.put_merged(BAD),
            lambda: lazy.retract(FP, GOOD.observations[0]),
            lambda: lazy.delete_if(FP, bool),
            lambda: lazy.delete(FP),
        ):
            with pytest.raises(StoreIgnoresPreconditionsError):
                write()
        written = [r for r in proxy.requests if r[0] in WRITES and PROBE_PREFIX not in r[1]]
        assert written == [] and lazy.get(FP) == GOOD  # the probe wrote under its prefix only


def test_warming_a_cache_opens_the_remote_store_behind_its_tier(tmp_path: Path) -> None:
    """``PlanCache.warm`` opens what the first lookup would otherwise open: the tiered
    store and the remote store behind it, with no lookup made."""
    opened = threading.Event()

    def remote() -> LocalStore:
        opened.set()
        return LocalStore(tmp_path / "remote")

    def tiered() -> PlanStore:
        return TieredStore(
            PlanStore(LazyStore("remote", remote)), local=PlanStore(LocalStore(tmp_path / "tier"))
        )

    cache = PlanCache(tiered, timeout=10.0)
    cache.warm()
    assert opened.wait(10)
