"""Apply and save on a stand-in worker (no vLLM needed): hits, misses, the gate, explicit
values, failing stores, and the public ``maybe_*_startup_plan`` functions."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import ModuleType

import orjson
import pytest

import plancache.integrations.vllm as plugin
from plancache import Plan, PlanCache, PlanStore, fingerprint
from plancache._backends.local import LocalStore
from plancache._defaults import EXPLAIN_DIR
from plancache.integrations.vllm import BootMode, apply, state
from plancache.testing import GiB
from tests.vllm.support import booted, key_of, stored


def test_miss_profiles_and_saves(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    key = key_of(worker)
    assert booted(worker) == 30 * GiB
    assert "memory-profiling" in worker.events
    [plan] = stored(store_dir)
    assert plan.fingerprint == key
    assert (plan.max_kv_cache_memory_bytes, plan.min_free_memory_baseline) == (30 * GiB, 80 * GiB)
    assert getattr(worker, apply.STATE_ATTR).mode == "profiling"


def test_a_miss_keeps_its_factors_and_names_the_explain_command(
    gpu: ModuleType, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    key = key_of(worker)
    with caplog.at_level(logging.INFO, logger="plancache"):
        booted(worker)
    kept = store_dir / EXPLAIN_DIR / f"{key}.json"  # the store is the node's local directory
    assert f"`plancache explain {store_dir} --factors {kept}` names what differs" in caplog.text
    deadline = time.monotonic() + 10
    while not kept.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fingerprint(orjson.loads(kept.read_bytes())["factors"]) == key
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="plancache"):
        booted(gpu.Worker(free_memory=80 * GiB))  # a hit: nothing to explain
    assert "plancache explain" not in caplog.text


def test_hit_skips_profiling_with_the_profiled_kv(gpu: ModuleType) -> None:
    first = gpu.Worker(profiled_kv=30 * GiB + 12345)
    profiled = booted(first)
    second = gpu.Worker(profiled_kv=1)  # would profile something else
    assert booted(second) == profiled
    assert "memory-profiling" not in second.events
    assert second.cache_config.kv_cache_memory_bytes == profiled
    assert getattr(second, apply.STATE_ATTR).mode is BootMode.APPLIED


def test_builtin_startup_plan_neither_applies_nor_saves(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLANCACHE_URL")
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(store_dir.parent / "vllm-cache"))
    worker = gpu.Worker()
    booted(worker)
    assert not {"builtin-apply", "builtin-save"} & set(worker.events)
    assert len(stored(store_dir.parent / "vllm-cache" / "startup_plan")) == 1


def test_explicit_value_respected(gpu: ModuleType, store_dir: Path) -> None:
    booted(gpu.Worker(profiled_kv=30 * GiB))  # a plan that would apply
    worker = gpu.Worker(kv_cache_memory_bytes=7 * GiB)
    assert booted(worker) == 7 * GiB
    assert worker.cache_config.kv_cache_memory_bytes == 7 * GiB
    [plan] = stored(store_dir)
    assert plan.max_kv_cache_memory_bytes == 30 * GiB
    assert getattr(worker, apply.STATE_ATTR).mode == "explicit"


def test_gate_rejects_plan_from_a_roomier_boot(
    gpu: ModuleType, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    booted(gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB))
    worker = gpu.Worker(free_memory=70 * GiB, profiled_kv=20 * GiB)
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert booted(worker) == 20 * GiB
    assert "memory-profiling" in worker.events
    assert "gate:free-memory-below-baseline" in caplog.text
    [plan] = stored(store_dir)  # 20 GiB at 70 does not dominate 30 GiB at 80
    assert plan.max_kv_cache_memory_bytes == 30 * GiB


def test_store_error_profiles(
    gpu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("PLANCACHE_URL", str(not_a_dir))
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert booted(worker) == 30 * GiB
    assert "memory-profiling" in worker.events


def test_stalled_store_profiles_within_budget(
    gpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stalled:
        def get(self, fp: str) -> None:
            time.sleep(30)

        def put(self, plan: Plan) -> None:
            time.sleep(30)

    state.use(state.Plugin(cache=PlanCache(lambda: Stalled(), timeout=0.3)))  # type: ignore[arg-type,return-value]
    worker = gpu.Worker(profiled_kv=30 * GiB)
    start = time.perf_counter()
    assert booted(worker) == 30 * GiB
    assert time.perf_counter() - start < 2.0  # lookup and record, 0.3 s each
    assert "memory-profiling" in worker.events


def test_save_key_is_lookup_key_though_config_changes(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker()
    before = worker.vllm_config.compute_hash()
    decision = plugin.maybe_apply_startup_plan(worker)
    assert decision is not None and decision.reason == "miss"
    worker.determine_available_memory()
    worker.compile_or_warm_up_model()
    assert worker.vllm_config.compute_hash() != before  # resolved during startup
    plugin.wait_saved(worker, 10.0)
    [plan] = stored(store_dir)
    assert plan.fingerprint == decision.fingerprint
    again = gpu.Worker()
    booted(again)
    assert "memory-profiling" not in again.events


def test_no_save_when_warmup_fails(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(fail_warmup=True)
    worker.determine_available_memory()
    with pytest.raises(RuntimeError):
        worker.compile_or_warm_up_model()
    assert plugin.wait_saved(worker, 10.0) is None
    assert stored(store_dir) == []


def test_public_functions_follow_vllms_semantics(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert plugin.maybe_apply_startup_plan(worker) is not None  # a miss
    assert worker.cache_config.kv_cache_memory_bytes is None
    recorded = plugin.maybe_save_startup_plan(worker, 29 * GiB)
    assert recorded is not None and recorded.reason == "created"
    assert plugin.maybe_save_startup_plan(worker, 29 * GiB) is None  # once per boot
    hit = gpu.Worker()
    decision = plugin.maybe_apply_startup_plan(hit)
    assert decision is not None and decision.reason == "hit"
    assert hit.cache_config.kv_cache_memory_bytes == 29 * GiB
    assert plugin.maybe_save_startup_plan(hit, 1 * GiB) is None  # applied: never saves
    explicit = gpu.Worker(kv_cache_memory_bytes=5 * GiB)
    assert plugin.maybe_apply_startup_plan(explicit) is None
    assert plugin.maybe_save_startup_plan(explicit, 5 * GiB) is None
    no_lookup = gpu.Worker(profiled_kv=31 * GiB)  # a key made now could be one no lookup makes
    assert plugin.maybe_save_startup_plan(no_lookup, 31 * GiB) is None
    assert [p.max_kv_cache_memory_bytes for p in stored(store_dir)] == [29 * GiB]


def test_public_functions_never_raise(store_dir: Path) -> None:
    assert plugin.maybe_apply_startup_plan(object()) is None  # type: ignore[arg-type]
    assert plugin.maybe_save_startup_plan(object(), GiB) is None  # type: ignore[arg-type]


def test_public_functions_do_nothing_when_disabled(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANCACHE_ENABLE", "0")
    worker = gpu.Worker()
    assert plugin.maybe_apply_startup_plan(worker) is None
    assert plugin.maybe_save_startup_plan(worker, GiB) is None
    assert stored(store_dir) == []


def test_the_timing_data_never_steers_the_decision(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Boot.costs`` only reports: the join waits for what ``begin`` left of the budget,
    whatever the costs say."""
    booted(gpu.Worker(profiled_kv=30 * GiB))  # a plan to apply

    class Slow(PlanStore):
        def _read(self, fp: str) -> tuple[bytes, object] | None:
            time.sleep(0.3)
            return super()._read(fp)

    state.use(state.Plugin(cache=PlanCache(Slow(LocalStore(store_dir)), timeout=5.0)))
    worker = gpu.Worker()
    worker.load_model()
    boot = apply.boot_of(worker)
    assert boot is not None and boot.spent < 1.0
    boot.costs["load_model"] = 60.0  # as if load_model had been slow to enter
    assert worker.determine_available_memory() == 30 * GiB
    assert boot.mode is BootMode.APPLIED


def test_the_budget_runs_from_the_lookups_start(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that never answers, weights that load for longer than the budget: the join
    after them waits for nothing (it waited the whole budget again before)."""
    booted(gpu.Worker(profiled_kv=30 * GiB))  # a plan the dead store would have served
    answer = threading.Event()

    class Dead(PlanStore):
        def _read(self, fp: str) -> tuple[bytes, object] | None:
            answer.wait(30)
            return super()._read(fp)

    budget = 3.0
    state.use(state.Plugin(cache=PlanCache(Dead(LocalStore(store_dir)), timeout=budget)))
    worker = gpu.Worker()
    try:
        worker.load_model()
        boot = apply.boot_of(worker)
        assert boot is not None and boot.pending is not None
        time.sleep(max(0.0, boot.pending.started + budget - time.perf_counter()) + 0.1)
        start = time.perf_counter()
        worker.determine_available_memory()
        after_weights = time.perf_counter() - start
    finally:
        answer.set()
    assert boot.decision is not None and boot.decision.reason == "timeout"
    assert boot.mode is BootMode.PROFILING
    assert after_weights < budget / 2  # about 0 s; the whole budget (3 s) before
