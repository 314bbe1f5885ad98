"""The bad-plan guards in the plugin's boot flow, on stand-in workers (no vLLM needed):
plausibility figures from the worker, the crash mark around applying, recovery at
``load_model``, and nothing raised into the boot when the breaker or the store fails. Real
processes killed after applying: ``test_real_worker.py`` (``tox -e vllm``)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import plancache.integrations.vllm as plugin
from plancache import Plan, open_store
from plancache._breaker import CRASHED_SUFFIX, MARK_SUFFIX, Mark, Process
from plancache.integrations.vllm import BootMode, apply
from plancache.integrations.vllm.factors import as_scalars
from plancache.testing import GiB
from tests.helpers import dead_mark
from tests.vllm.support import booted, stored


def _seed(directory: Path, worker: Any, kv: int, baseline: int) -> Plan:
    """A record for ``worker``'s key with one observation, as another node would write it."""
    plan = Plan.new(
        as_scalars(plugin.worker_factors(worker)),
        kv_cache_memory_bytes=kv,
        free_memory_baseline=baseline,
    )
    open_store(str(directory)).put(plan)
    return plan


def _marks(directory: Path, suffix: str = MARK_SUFFIX) -> list[Path]:
    return sorted((directory / "marks").glob("*" + suffix))


def _dead_mark(directory: Path, plan: Plan) -> Path:
    """The mark a boot left in ``directory`` when it died with ``plan`` applied."""
    return dead_mark(directory / "marks", plan.fingerprint, plan.observations[0])


def test_a_poisoned_record_is_never_applied(
    gpu: ModuleType, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """KV = baseline = free memory: it passes the free-memory gate, not plausibility (96 GiB
    x 0.9 - 16 GiB of weights = 70.4 GiB)."""
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    _seed(store_dir, worker, kv=80 * GiB, baseline=80 * GiB)
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert booted(worker) == 30 * GiB
    assert "memory-profiling" in worker.events
    boot = apply.boot_of(worker)
    assert boot is not None and boot.decision is not None
    assert boot.decision.reason == "gate:exceeds-budget"
    assert "requested=86.40GiB" in caplog.text and "weights=16.00GiB" in caplog.text
    assert _marks(store_dir) == []


def test_the_largest_plausible_observation_is_applied(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(free_memory=80 * GiB)
    _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    _seed(store_dir, worker, kv=75 * GiB, baseline=79 * GiB)  # over 70.4 GiB
    assert booted(worker) == 20 * GiB
    assert "memory-profiling" not in worker.events


def test_an_implausible_observation_is_retracted_so_honest_ones_are_kept(
    gpu: ModuleType, store_dir: Path
) -> None:
    """78 GiB at a 78 GiB baseline dominates every honest observation of this key (a
    larger KV from a lower baseline), so merges would drop them and every boot would
    profile; the first boot that sees it retracts it, and its own observation stays."""
    first = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    poisoned = _seed(store_dir, first, kv=78 * GiB, baseline=78 * GiB)
    assert booted(first) == 30 * GiB and "memory-profiling" in first.events
    [record] = stored(store_dir)
    assert [(o.kv_cache_memory_bytes, o.free_memory_baseline) for o in record.observations] == [
        (30 * GiB, 80 * GiB)
    ]
    assert [t.observation for t in record.retracted] == [poisoned.observations[0].digest]
    second = gpu.Worker(free_memory=80 * GiB, profiled_kv=31 * GiB)
    assert booted(second) == 30 * GiB and "memory-profiling" not in second.events


def test_a_mark_is_held_from_the_decision_until_the_warm_up_returned(
    gpu: ModuleType, store_dir: Path
) -> None:
    worker = gpu.Worker()
    plan = _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    worker.load_model()
    assert worker.determine_available_memory() == 20 * GiB
    [path] = _marks(store_dir)
    mark = Mark.parse(path, path.read_bytes())
    assert mark is not None and mark.observation == plan.observations[0]
    assert mark.process == Process.current()
    worker.compile_or_warm_up_model()
    assert _marks(store_dir) == []
    boot = apply.boot_of(worker)
    assert boot is not None and set(boot.costs) >= {"breaker.arm", "breaker.disarm"}


def test_a_warm_up_that_raises_leaves_the_mark(gpu: ModuleType, store_dir: Path) -> None:
    """The plan may not have fitted: once this process is gone, the next boot on the node
    reads the mark as a crash."""
    worker = gpu.Worker(fail_warmup=True)
    _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    worker.load_model()
    worker.determine_available_memory()
    with pytest.raises(RuntimeError):
        worker.compile_or_warm_up_model()
    assert len(_marks(store_dir)) == 1


def test_a_dead_boots_mark_is_avoided_and_retracted(
    gpu: ModuleType, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    plan = _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    _dead_mark(store_dir, plan)
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert booted(worker) == 30 * GiB  # profiles
    assert "gate:crashed-before" in caplog.text
    boot = apply.boot_of(worker)
    assert boot is not None and boot.avoid == {plan.observations[0].digest}
    assert boot.mode is BootMode.PROFILING and len(boot.retractions) == 1
    [record] = stored(store_dir)
    assert [o.kv_cache_memory_bytes for o in record.observations] == [30 * GiB]
    assert [t.observation for t in record.retracted] == [plan.observations[0].digest]
    assert _marks(store_dir) == [] and len(_marks(store_dir, CRASHED_SUFFIX)) == 1
    again = gpu.Worker(free_memory=80 * GiB)
    assert booted(again) == 30 * GiB and "memory-profiling" not in again.events


def test_recovery_keeps_store_latency_off_load_model(
    gpu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead mark on a node whose shared store never answers: ``load_model``'s entry does not
    wait for the retraction, the boot profiles, nothing raises."""
    from plancache.testing.hostile import SilentServer

    tier = tmp_path / "tier"
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    plan = _seed(tier, worker, kv=20 * GiB, baseline=60 * GiB)
    _dead_mark(tier, plan)
    with SilentServer() as silent:
        monkeypatch.setenv("PLANCACHE_URL", "s3://never/plans")
        monkeypatch.setenv("PLANCACHE_LOCAL_TIER", str(tier))
        monkeypatch.setenv("PLANCACHE_TIMEOUT", "1")
        monkeypatch.setenv(
            "PLANCACHE_STORAGE_OPTIONS",
            json.dumps({"endpoint_url": silent.endpoint, "key": "k", "secret": "s"}),
        )
        start = time.perf_counter()
        worker.load_model()
        entry = time.perf_counter() - start
        assert worker.determine_available_memory() == 30 * GiB
        worker.compile_or_warm_up_model()
        plugin.wait_saved(worker, 10.0)
    boot = apply.boot_of(worker)
    assert boot is not None and boot.mode is BootMode.PROFILING
    assert boot.avoid == {plan.observations[0].digest}
    assert entry < 0.5  # the retraction waits up to 1 s on the silent store, in the background


def test_unwritable_marks_mean_no_plan_applied_and_no_error(
    gpu: ModuleType, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    (store_dir / "marks").write_text("not a directory")
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert booted(worker) == 30 * GiB
    assert "memory-profiling" in worker.events
    assert "crash mark not written" in caplog.text
    assert "no crash mark could be written, so the plan is not applied" in caplog.text


def test_public_functions_arm_and_warmed_up_disarms(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker()
    _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    decision = plugin.maybe_apply_startup_plan(worker)
    assert decision is not None and decision.hit and len(_marks(store_dir)) == 1
    plugin.warmed_up(worker)
    assert _marks(store_dir) == []
    plugin.warmed_up(worker)  # once is enough; again is harmless
    plugin.warmed_up(object())  # type: ignore[arg-type]


def test_marks_of_other_keys_and_live_processes_are_left_alone(
    gpu: ModuleType, store_dir: Path
) -> None:
    worker = gpu.Worker(rank=0, world_size=2)
    other = gpu.Worker(rank=1, world_size=2)
    mine = _seed(store_dir, worker, kv=20 * GiB, baseline=60 * GiB)
    theirs = _seed(store_dir, other, kv=20 * GiB, baseline=60 * GiB)
    assert mine.fingerprint != theirs.fingerprint
    dead_other = _dead_mark(store_dir, theirs)
    live = plugin.maybe_apply_startup_plan(gpu.Worker(rank=0, world_size=2))  # same key, alive
    assert live is not None and live.hit
    assert booted(worker) == 20 * GiB  # applies: no dead mark of its key
    assert dead_other.exists() and len(_marks(store_dir)) == 2
    store = open_store(str(store_dir))
    assert (store.get(mine.fingerprint), store.get(theirs.fingerprint)) == (mine, theirs)
