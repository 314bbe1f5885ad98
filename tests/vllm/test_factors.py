"""The factors of a worker's plan key, on a stand-in worker (no vLLM needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import get_type_hints

import pytest

import plancache.integrations.vllm as plugin
from plancache.integrations.vllm import factors
from plancache.integrations.vllm.factors import DeviceFactors, WorkerFactors
from plancache.testing import GiB
from tests.vllm.support import fake_device_factors, stored

DOCUMENTED = {
    "vllm",
    "torch",
    "cuda",
    "estimate_cudagraphs",
    "device_name",
    "device_total_memory",
    "device_capability",
    "vllm_config",
    "gpu_memory_utilization",
    "rank",
    "world_size",
}


def test_gpu_memory_utilization_is_part_of_the_key(gpu: ModuleType) -> None:
    gpu.Worker(gpu_memory_utilization=0.9, profiled_kv=60 * GiB).boot()
    half = gpu.Worker(gpu_memory_utilization=0.5, profiled_kv=30 * GiB)
    assert half.boot() == 30 * GiB
    assert "memory-profiling" in half.events


def test_device_factors_read_the_workers_own_device(
    gpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def device_factors(device: object) -> DeviceFactors:
        seen.append(device)
        return fake_device_factors(device)

    monkeypatch.setattr(factors, "device_factors", device_factors)
    gpu.Worker(rank=3, world_size=1).boot()
    assert seen == ["cuda:3"]


def test_factors_cover_the_documented_inputs(gpu: ModuleType) -> None:
    worker_factors = plugin.worker_factors(gpu.Worker(rank=1, world_size=2))
    assert set(worker_factors) == DOCUMENTED
    assert (worker_factors["rank"], worker_factors["world_size"]) == (1, 2)


def test_worker_factors_type_names_every_recorded_factor(gpu: ModuleType) -> None:
    recorded: Mapping[str, object] = plugin.worker_factors(gpu.Worker())
    hints = get_type_hints(WorkerFactors)
    assert set(hints) == DOCUMENTED == WorkerFactors.__required_keys__
    assert all(isinstance(recorded[name], hints[name]) for name in hints)


def test_factor_errors_profile_and_save_nothing(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: object) -> DeviceFactors:
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(factors, "device_factors", broken)
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert worker.boot() == 30 * GiB
    assert stored(store_dir) == []
