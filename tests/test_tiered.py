"""The local tier in front of a remote store, and read-only mode (counted at the remote)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from plancache import PlanCache, PlanStore, PutOutcome, open_store
from plancache import _background as background
from plancache._backends.local import LocalStore
from plancache._backends.tiered import UNSHARED_PREFIX, TieredStore
from plancache._config import Settings
from plancache._keys import plan_object_name
from plancache._signing import MIN_KEY_CHARS, Keyring
from plancache.errors import PlanStoreError, PlanStoreReadOnlyError
from plancache.testing import FACTORS, GiB, StoreContract, make_plan
from plancache.testing.contract import StoreFactory, WriteRaw
from plancache.testing.hostile import FaultyProxy, writes
from plancache.testing.servers import CountingProxy, MotoS3
from tests.helpers import local_layer


class TestTieredS3Contract(StoreContract):
    """The contract through ``Settings.open_store`` with a local tier (the process race runs
    on the bare remote, in ``TestS3Contract``, and so does the contention race)."""

    supports_processes = False
    contention_writers = 0

    @pytest.fixture
    def store_factory(self, moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> StoreFactory:
        options = {"endpoint_url": moto_s3.endpoint}
        settings = Settings(
            f"s3://{s3_bucket}/plans", local_tier=str(tmp_path / "tier"), storage_options=options
        )
        return settings.open_store

    @pytest.fixture
    def write_raw(self, moto_s3: MotoS3, s3_bucket: str) -> WriteRaw:
        """Into the remote; the local tier starts empty."""
        return lambda fp, data: moto_s3.put_object(s3_bucket, f"plans/{plan_object_name(fp)}", data)

    def test_the_store_is_tiered(self, store: PlanStore) -> None:
        assert isinstance(store, TieredStore) and store.local is not None


@pytest.fixture
def remote(s3_proxy: CountingProxy, s3_bucket: str) -> PlanStore:
    return open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_proxy.endpoint)


def _settings(remote: PlanStore, s3_proxy: CountingProxy, **kw: Any) -> Settings:
    return Settings(remote.url, storage_options={"endpoint_url": s3_proxy.endpoint}, **kw)


def test_remote_hit_backfills_and_local_hit_costs_nothing(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path
) -> None:
    plan = make_plan()
    remote.put(plan)
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    store = _settings(remote, s3_proxy, local_tier=str(local_layer(tier).root)).open_store()
    s3_proxy.reset()
    assert store.get(plan.fingerprint) == plan
    assert len(s3_proxy.requests) == 1
    assert tier.get(plan.fingerprint) == plan
    s3_proxy.reset()
    assert store.get(plan.fingerprint) == plan
    assert s3_proxy.requests == []


def test_a_write_reaches_both_tiers(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path
) -> None:
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    store = _settings(remote, s3_proxy, local_tier=str(local_layer(tier).root)).open_store()
    plan = make_plan()
    assert store.put(plan) is PutOutcome.CREATED
    assert remote.get(plan.fingerprint) == plan == tier.get(plan.fingerprint)


def test_read_only_never_writes_the_remote(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path
) -> None:
    stored = make_plan()
    remote.put(stored)
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    settings = _settings(remote, s3_proxy, local_tier=str(local_layer(tier).root), read_only=True)
    store = settings.open_store()
    s3_proxy.reset()
    assert store.get(stored.fingerprint) == stored  # reads the remote, backfills local
    other = make_plan(5 * GiB, 50 * GiB, {"model": "other"})
    assert store.put(other) is PutOutcome.CREATED  # into the local tier only
    assert store.put(make_plan(11 * GiB, 60 * GiB)) is PutOutcome.REPLACED
    store.delete(stored.fingerprint)
    methods = [m for m, _ in s3_proxy.requests]
    assert methods == ["GET"], s3_proxy.requests
    assert tier.get(other.fingerprint) == other
    assert remote.get(other.fingerprint) is None
    assert remote.get(stored.fingerprint) == stored


def test_read_only_without_tier_refuses_writes(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path
) -> None:
    store = _settings(remote, s3_proxy, read_only=True).open_store()
    s3_proxy.reset()
    with pytest.raises(PlanStoreReadOnlyError):
        store.put(make_plan())
    fp = make_plan().fingerprint  # the other writes are refused too: no request at all
    for write in (
        lambda: store.rewrite(fp, lambda p: None),
        lambda: store.delete_if(fp, bool),
        lambda: store.delete(fp),
        lambda: store.layer.write_object("x", [b"x"]),
        lambda: store.layer.delete_object("x"),
    ):
        with pytest.raises(PlanStoreReadOnlyError, match="read-only"):
            write()
    recorded = PlanCache(store, timeout=30.0).record(
        FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB
    )
    assert recorded.reason == "store-error" and recorded.outcome is None
    assert s3_proxy.requests == []


def test_broken_local_tier_never_fails_a_remote_hit(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan = make_plan()
    remote.put(plan)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = TieredStore(remote, local=PlanStore(LocalStore(blocker / "tier")))
    caplog.set_level(logging.WARNING, logger="plancache")
    assert store.get(plan.fingerprint) == plan
    assert any("local tier" in r.getMessage() for r in caplog.records)


def test_invalid_local_record_falls_back_to_the_remote(remote: PlanStore, tmp_path: Path) -> None:
    plan = make_plan()
    remote.put(plan)
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    tier._create(plan.fingerprint, b"{")
    store = TieredStore(remote, local=tier)
    assert store.get(plan.fingerprint) == plan
    assert tier.get(plan.fingerprint) == plan  # the invalid record was replaced


def test_a_fleet_shares_plans_through_the_environment(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    def env(node: str) -> dict[str, str]:
        return {
            "PLANCACHE_URL": f"s3://{s3_bucket}/fleet",
            "PLANCACHE_LOCAL_TIER": str(tmp_path / node),
            "PLANCACHE_STORAGE_OPTIONS": json.dumps({"endpoint_url": moto_s3.endpoint}),
        }

    first = PlanCache.from_env(env("a"))
    assert first.lookup(FACTORS, current_free_memory=70 * GiB).reason == "miss"
    rec = first.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)
    assert rec.outcome is PutOutcome.CREATED
    second = PlanCache.from_env(env("b"))
    decision = second.lookup(FACTORS, current_free_memory=72 * GiB)
    assert decision.reason == "hit" and decision.kv_cache_memory_bytes == 10 * GiB
    assert PlanStore(LocalStore(tmp_path / "b")).get(decision.fingerprint or "") is not None


def test_a_plan_the_gate_rejects_locally_is_looked_up_in_the_remote(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path
) -> None:
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    store = _settings(remote, s3_proxy, local_tier=str(local_layer(tier).root)).open_store()
    cache = PlanCache(store, timeout=30.0)
    cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=80 * GiB)
    better = make_plan(10 * GiB, 70 * GiB)  # recorded by a node with less free memory
    assert remote.put(better) is PutOutcome.REPLACED
    s3_proxy.reset()
    d = cache.lookup(FACTORS, 75 * GiB)  # the local plan (80 GiB baseline) cannot apply
    assert (d.reason, d.plan) == ("hit", better)
    assert len(s3_proxy.requests) == 1
    assert tier.get(better.fingerprint) == better  # the remote's plan replaced the local one
    s3_proxy.reset()
    assert cache.lookup(FACTORS, 75 * GiB).reason == "hit"
    assert s3_proxy.requests == []


def test_the_local_tier_learns_the_plan_the_remote_kept(
    remote: PlanStore, s3_proxy: CountingProxy, tmp_path: Path
) -> None:
    stored = make_plan(20 * GiB, 60 * GiB)
    remote.put(stored)
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    store = _settings(remote, s3_proxy, local_tier=str(local_layer(tier).root)).open_store()
    assert store.put(make_plan(10 * GiB, 70 * GiB)) is PutOutcome.KEPT
    assert tier.get(stored.fingerprint) == stored


def test_a_failed_remote_write_still_fills_the_local_tier(tmp_path: Path) -> None:
    from plancache.testing.servers import closed_port

    endpoint = f"http://127.0.0.1:{closed_port()}"
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    settings = Settings(
        "s3://bucket/p",
        local_tier=str(local_layer(tier).root),
        storage_options={"endpoint_url": endpoint},
        write_patience=0.0,  # the write gives up at its first probe without a verdict
    )
    # a budget loose enough that opening the client beside other test workers fits in it
    recorded = PlanCache(settings.open_store, timeout=60).record(
        FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB
    )
    assert (recorded.outcome, recorded.reason) == (None, "store-error")
    kept = tier.get(make_plan().fingerprint)
    assert kept is not None
    assert (kept.max_kv_cache_memory_bytes, kept.min_free_memory_baseline) == (10 * GiB, 70 * GiB)


ROOT = Path(__file__).resolve().parents[1]
FORKED = """
import os, sys
from plancache import PlanStore
from plancache._config import Settings
from plancache._backends.local import LocalStore
from plancache.errors import PlanStoreError
from plancache.testing import make_plan

endpoint, bucket, tier = sys.argv[1:]
store = Settings(f"s3://{bucket}/p", local_tier=tier,
                 storage_options={"endpoint_url": endpoint}).open_store()
store.put(make_plan(kv=1 << 30))  # the client and its loop now exist in this process
pid = os.fork()
if pid == 0:
    code = 0
    try:
        store.put(make_plan(kv=2 << 30))
    except PlanStoreError as exc:
        print("store-error:", exc, flush=True)
    except BaseException as exc:
        print("other:", type(exc).__name__, exc, flush=True)
        code = 3
    plan = PlanStore(LocalStore(tier)).get(make_plan().fingerprint)
    print("local-kv:", None if plan is None else plan.max_kv_cache_memory_bytes, flush=True)
    os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_after_a_fork_the_local_tier_is_still_written(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(FORKED),
            moto_s3.endpoint,
            s3_bucket,
            str(tmp_path / "tier"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert f"local-kv: {2 << 30}" in out.stdout, out.stdout


def test_the_local_tier_has_the_plan_before_a_slow_remote_answers(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """A node keeps what it measured at once, however long the remote write takes (a
    record bounded by its budget goes on in the background; the next boot may come first)."""
    tier = PlanStore(LocalStore(tmp_path / "tier"))
    plan = make_plan()
    with CountingProxy(moto_s3.endpoint, delay_s=2.0) as slow:
        remote = open_store(f"s3://{s3_bucket}/p", endpoint_url=slow.endpoint, read_timeout=10)
        store = TieredStore(remote, local=tier)
        writing = background.start(lambda: store.put(plan))
        deadline = time.monotonic() + 1.5
        while tier.get(plan.fingerprint) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tier.get(plan.fingerprint) == plan
        assert not writing.done()  # the remote has not answered yet
        assert writing.wait(30) is PutOutcome.CREATED
    assert remote.get(plan.fingerprint) == plan


def test_a_plan_the_remote_missed_is_offered_again_by_a_later_boot(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """The remote fails the write: the local tier keeps the plan and a mark; a later boot's
    warm writes it to the remote and removes the mark; a local hit then costs nothing."""
    url, tier = f"s3://{s3_bucket}/p", tmp_path / "tier"

    def settings(endpoint: str) -> Settings:
        options = {"endpoint_url": endpoint}
        return Settings(
            url, storage_options=options, local_tier=str(tier), trust_preconditions=True
        )

    plan = make_plan()
    with FaultyProxy(moto_s3.endpoint, 400, writes) as broken, pytest.raises(PlanStoreError):
        settings(broken.endpoint).open_store().put(plan)
    local = PlanStore(LocalStore(tier))
    assert local.get(plan.fingerprint) == plan
    assert list(local.layer.list_objects(UNSHARED_PREFIX)) == [UNSHARED_PREFIX + plan.fingerprint]
    with CountingProxy(moto_s3.endpoint) as healthy:
        later = settings(healthy.endpoint).open_store()
        assert isinstance(later, TieredStore)
        assert later.offer_unshared() == 1
        assert open_store(url, endpoint_url=moto_s3.endpoint).get(plan.fingerprint) == plan
        assert list(local.layer.list_objects(UNSHARED_PREFIX)) == []
        healthy.reset()
        assert later.offer_unshared() == 0 and later.get(plan.fingerprint) == plan
        assert healthy.requests == []  # nothing marked, a local hit: no request


def test_a_mark_that_cannot_be_shared_holds_back_no_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first mark (in listing order) points at a plan kept unsigned before the fleet
    adopted a key: it is logged and kept; the signed plans marked after it are shared."""
    key = "k" * MIN_KEY_CHARS
    plans = sorted(
        (make_plan(factors={**FACTORS, "model": f"m{i}"}) for i in range(4)),
        key=lambda p: p.fingerprint,
    )
    before, signing = (
        PlanStore(LocalStore(tmp_path / "tier")),
        PlanStore(LocalStore(tmp_path / "tier")),
    )
    signing.use_keyring(Keyring(key))
    for i, plan in enumerate(plans):
        (before if i == 0 else signing).put(plan)
        signing.layer.write_object(UNSHARED_PREFIX + plan.fingerprint, [b""])
    remote = PlanStore(LocalStore(tmp_path / "remote"))
    store = TieredStore(remote, local=PlanStore(LocalStore(tmp_path / "tier")))
    store.use_keyring(Keyring(key))
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert store.offer_unshared() == 3
    assert [remote.get(p.fingerprint) is not None for p in plans] == [False, True, True, True]
    marks = list(PlanStore(LocalStore(tmp_path / "tier")).layer.list_objects(UNSHARED_PREFIX))
    assert marks == [UNSHARED_PREFIX + plans[0].fingerprint]
    assert f"the plan {plans[0].fingerprint[:12]} this node kept is not shared" in caplog.text
    # a remote that does not answer ends the round at its first offer and keeps every mark
    silent = open_store("s3://bucket/p", endpoint_url="http://127.0.0.1:9", key="k", secret="s")
    store = TieredStore(silent, local=PlanStore(LocalStore(tmp_path / "tier")))
    store.use_keyring(Keyring(key))
    signing.layer.write_object(UNSHARED_PREFIX + plans[1].fingerprint, [b""])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert store.offer_unshared() == 0
    assert "plans not shared yet stay marked: PlanStoreUnavailableError" in caplog.text
    assert plans[1].fingerprint[:12] not in caplog.text  # not tried as one mark's failure
    assert (
        len(list(PlanStore(LocalStore(tmp_path / "tier")).layer.list_objects(UNSHARED_PREFIX))) == 2
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another uid")
def test_a_mark_and_record_a_neighbour_planted_are_never_offered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A group-writable local tier (a hostPath under umask 002): another user's mark and
    record (here a 70 GiB plan) were offered to the remote with this node's credentials.
    Now only this user's are; the planted ones are logged and left."""
    tier = tmp_path / "tier"
    tier.mkdir(mode=0o775)
    os.chmod(tier, 0o775)
    mine = make_plan(factors={**FACTORS, "model": "mine"})
    planted = make_plan(kv=70 * GiB, baseline=75 * GiB, factors={**FACTORS, "model": "theirs"})
    for plan in (mine, planted):
        PlanStore(LocalStore(tier)).put(plan)
        PlanStore(LocalStore(tier)).layer.write_object(UNSHARED_PREFIX + plan.fingerprint, [b""])
    for name in (plan_object_name(planted.fingerprint), UNSHARED_PREFIX + planted.fingerprint):
        os.chown(tier / name, 65534, -1)
    remote = PlanStore(LocalStore(tmp_path / "remote"))
    with caplog.at_level(logging.WARNING, logger="plancache"):
        assert TieredStore(remote, local=PlanStore(LocalStore(tier))).offer_unshared() == 1
    assert remote.get(mine.fingerprint) == mine and remote.get(planted.fingerprint) is None
    assert f"the plan {planted.fingerprint[:12]} this node kept is not shared" in caplog.text
    assert "owned by uid 65534" in caplog.text
    assert list(PlanStore(LocalStore(tier)).layer.list_objects(UNSHARED_PREFIX)) == [
        UNSHARED_PREFIX + planted.fingerprint
    ]
