"""The factors of a worker's plan key, on a stand-in worker (no vLLM needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import get_type_hints

import pytest

import plancache.integrations.vllm as plugin
from plancache._inventory import plans as inventory
from plancache.integrations.vllm import factors
from plancache.integrations.vllm.factors import DeviceFactors, WorkerFactors
from plancache.integrations.vllm.worker import WorkerLike
from plancache.testing import GiB
from tests.vllm.support import booted, fake_device_factors, stored

DOCUMENTED = {
    "vllm",
    "torch",
    "cuda",
    "nccl",
    "estimate_cudagraphs",
    "vllm_env",
    "pytorch_cuda_alloc_conf",
    "pytorch_hip_alloc_conf",
    "pytorch_alloc_conf",
    "device_name",
    "device_total_memory",
    "device_capability",
    "vllm_config",
    "gpu_memory_utilization",
    "disable_custom_all_reduce",
    "rank",
    "world_size",
}


def test_gpu_memory_utilization_is_part_of_the_key(gpu: ModuleType) -> None:
    booted(gpu.Worker(gpu_memory_utilization=0.9, profiled_kv=60 * GiB))
    half = gpu.Worker(gpu_memory_utilization=0.5, profiled_kv=30 * GiB)
    assert booted(half) == 30 * GiB
    assert "memory-profiling" in half.events


def test_device_factors_read_the_workers_own_device(
    gpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def device_factors(worker: WorkerLike) -> DeviceFactors:
        seen.append((worker.local_rank, worker.device))
        return fake_device_factors(worker)

    monkeypatch.setattr(factors, "device_factors", device_factors)
    booted(gpu.Worker(rank=3, world_size=1))
    assert seen == [(3, "cuda:3")]


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
    def broken(worker: WorkerLike) -> DeviceFactors:
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(factors, "device_factors", broken)
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert booted(worker) == 30 * GiB
    assert stored(store_dir) == []
    # plancache cannot serve this worker: vLLM's built-in functions stay in charge of it
    assert {"builtin-apply", "builtin-save"} <= set(worker.events)


def test_labels_describe_the_record(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker()
    booted(worker)
    plugin.wait_saved(worker, 5.0)
    [plan] = stored(store_dir)
    assert (
        plan.labels
        == plugin.worker_labels(worker)
        == {
            "model": "standin/model",
            "dtype": "bfloat16",
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
        }
    )


def test_a_record_describes_its_model_and_device(gpu: ModuleType, store_dir: Path) -> None:
    """What ``plancache ls`` shows of a plugin's record: the model and device it names."""
    booted(gpu.Worker())
    [plan] = stored(store_dir)
    assert (inventory.model(plan), inventory.device(plan)) == ("standin/model", "Standin GPU")
