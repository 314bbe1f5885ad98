"""The factors of a worker's plan key: everything its profiled KV-cache size depends on.

Reads vLLM, torch and the worker's own device only when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, cast

from plancache.integrations.vllm.worker import WorkerLike
from plancache.plan import Scalar


class SoftwareFactors(TypedDict):
    """The vLLM and torch builds, and the vLLM setting that changes the profiled value."""

    vllm: str
    torch: str
    cuda: str
    estimate_cudagraphs: bool


class DeviceFactors(TypedDict):
    """The worker's own device."""

    device_name: str
    device_total_memory: int
    device_capability: str


class WorkerFactors(SoftwareFactors, DeviceFactors):
    """The factors the plugin records: software, device, ``VllmConfig.compute_hash()``,
    ``gpu_memory_utilization`` (which vLLM's hash leaves out), rank and world size."""

    vllm_config: str
    gpu_memory_utilization: float
    rank: int
    world_size: int


def software_factors() -> SoftwareFactors:
    """The factors of the installed vLLM and torch."""
    import torch
    import vllm
    import vllm.envs as envs

    return {
        "vllm": str(vllm.__version__),
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda or getattr(torch.version, "hip", None) or ""),
        "estimate_cudagraphs": bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS),
    }


def device_factors(device: object) -> DeviceFactors:
    """Name, total memory and compute capability of ``device`` (the worker's own)."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "device_name": str(props.name),
        "device_total_memory": int(props.total_memory),
        "device_capability": f"{props.major}.{props.minor}",
    }


def worker_factors(worker: WorkerLike) -> WorkerFactors:
    """The factors of ``worker``'s plan key; raises what reading the worker raises."""
    return {
        **software_factors(),
        **device_factors(worker.device),
        "vllm_config": str(worker.vllm_config.compute_hash()),
        "gpu_memory_utilization": float(worker.cache_config.gpu_memory_utilization),
        "rank": int(worker.rank),
        "world_size": int(worker.parallel_config.world_size),
    }


def as_scalars(factors: WorkerFactors) -> Mapping[str, Scalar]:
    """``factors`` as the plan store takes them (every value is a ``Scalar`` by its type)."""
    return cast("Mapping[str, Scalar]", factors)
