"""The factors of a worker's plan key: everything its profiled KV-cache size depends on, and
the descriptive labels of its record.

``VllmConfig.compute_hash()`` covers the vLLM version and the model, cache, parallel,
scheduler and compilation configs; the other factors are what changes the profiled value
although that hash leaves it out (vLLM 0.33.0; why each, in docs/vllm.md). Reads vLLM, torch
and the worker's own device only when called.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

import orjson

from plancache._defaults import EXPLAIN_DIR
from plancache._directory import Directory
from plancache._keys import Scalar
from plancache._plan import DEVICE_FACTOR, MAX_LABEL_TEXT, MODEL_LABEL
from plancache.integrations.vllm.worker import WorkerLike

MEMORY_ENVS = (
    "VLLM_USE_NCCL_SYMM_MEM",
    "VLLM_ALLREDUCE_USE_SYMM_MEM",
    "VLLM_ALLREDUCE_USE_FLASHINFER",
    "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND",
    "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE",
    "VLLM_DEEPEP_BUFFER_SIZE_MB",
    "VLLM_USE_BREAKABLE_CUDAGRAPH",
)
"""vLLM environment variables that size GPU buffers or pick the all-reduce (not hashed by
``compute_hash()``); ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is its own factor."""
_INT_LIMIT = 1 << 63


class SoftwareFactors(TypedDict):
    """The vLLM, torch and collective-library builds, and the process settings that change
    the profiled value."""

    vllm: str
    torch: str
    cuda: str
    nccl: str
    estimate_cudagraphs: bool
    vllm_env: str
    pytorch_cuda_alloc_conf: str
    pytorch_hip_alloc_conf: str
    pytorch_alloc_conf: str


class DeviceFactors(TypedDict):
    """The worker's own device, as ``vllm.platforms.current_platform`` describes it;
    ``device_name`` is the format's ``DEVICE_FACTOR`` (what ``plancache ls`` shows)."""

    device_name: str
    device_total_memory: int
    device_capability: str
    """``major.minor``; "" where the platform has none (XPU)."""


class WorkerFactors(SoftwareFactors, DeviceFactors):
    """The factors the plugin records: software, device, ``VllmConfig.compute_hash()``,
    ``gpu_memory_utilization`` and ``disable_custom_all_reduce`` (which that hash leaves
    out), rank and world size."""

    vllm_config: str
    gpu_memory_utilization: float
    disable_custom_all_reduce: bool
    rank: int
    world_size: int


def _nccl_version(torch: object) -> str:
    """NCCL's (RCCL's on ROCm) version as ``major.minor.patch``; "" without it."""
    try:
        version = torch.cuda.nccl.version()  # type: ignore[attr-defined]
    except Exception:  # CPU or XPU builds have no NCCL
        return ""
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def software_factors() -> SoftwareFactors:
    """The factors of the installed vLLM, torch and NCCL and of this process's settings."""
    import torch
    import vllm
    import vllm.envs as envs

    version = torch.version
    accelerator = version.cuda or getattr(version, "hip", None) or getattr(version, "xpu", None)
    memory_envs = {name: getattr(envs, name, None) for name in MEMORY_ENVS}
    return {
        "vllm": str(vllm.__version__),
        "torch": str(torch.__version__),
        "cuda": str(accelerator or ""),
        "nccl": _nccl_version(torch),
        "estimate_cudagraphs": bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS),
        "vllm_env": json.dumps(memory_envs, sort_keys=True, default=str),
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "pytorch_hip_alloc_conf": os.environ.get("PYTORCH_HIP_ALLOC_CONF", ""),
        "pytorch_alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF", ""),
    }


def device_factors(worker: WorkerLike) -> DeviceFactors:
    """Name, total memory and compute capability of ``worker``'s own device, from
    ``current_platform`` (CUDA, ROCm, XPU), as vLLM's built-in reads them but for this
    worker's device: name and memory by logical id (``local_rank``), capability by visible
    id (``device.index``)."""
    from vllm.platforms import current_platform as platform

    logical = int(worker.local_rank)
    visible = getattr(worker.device, "index", None)
    capability = platform.get_device_capability(logical if visible is None else int(visible))
    return {
        DEVICE_FACTOR: str(platform.get_device_name(logical)),
        "device_total_memory": int(platform.get_device_total_memory(logical)),
        "device_capability": "" if capability is None else capability.as_version_str(),
    }


def worker_factors(worker: WorkerLike) -> WorkerFactors:
    """The factors of ``worker``'s plan key; raises what reading the worker raises."""
    parallel = worker.parallel_config
    return {
        **software_factors(),
        **device_factors(worker),
        "vllm_config": str(worker.vllm_config.compute_hash()),
        "gpu_memory_utilization": float(worker.cache_config.gpu_memory_utilization),
        "disable_custom_all_reduce": bool(getattr(parallel, "disable_custom_all_reduce", False)),
        "rank": int(worker.rank),
        "world_size": int(parallel.world_size),
    }


def worker_labels(worker: WorkerLike) -> dict[str, Scalar]:
    """Descriptive labels of ``worker``'s record (never part of the key): model, dtype,
    tensor and pipeline parallel sizes, ``max_model_len``; what the config lacks is left
    out. Never raises."""
    labels: dict[str, Scalar] = {}
    config = worker.vllm_config
    model = getattr(config, "model_config", None)
    parallel = getattr(config, "parallel_config", None)
    wanted: tuple[tuple[str, object, str], ...] = (
        (MODEL_LABEL, model, "model"),
        ("dtype", model, "dtype"),
        ("max_model_len", model, "max_model_len"),
        ("tensor_parallel_size", parallel, "tensor_parallel_size"),
        ("pipeline_parallel_size", parallel, "pipeline_parallel_size"),
    )
    for label, source, attr in wanted:
        value = getattr(source, attr, None)
        if value is None:
            continue
        if isinstance(value, bool):
            labels[label] = bool(value)
        elif isinstance(value, int) and _INT_LIMIT > value >= -_INT_LIMIT:
            labels[label] = int(value)
        else:
            labels[label] = str(value).removeprefix("torch.")[:MAX_LABEL_TEXT]
    return labels


MAX_EXPLAINED = 64
"""Most factor files kept there (the oldest go first)."""


def keep_for_explain(
    local_dir: str | os.PathLike[str],
    fp: str,
    factors: Mapping[str, object],
    labels: Mapping[str, Scalar],
) -> Path:
    """Write ``{"factors", "labels"}`` of a miss as ``<local_dir>/explain/<fp>.json``
    (``plancache explain STORE --factors`` reads it): atomic (temp file, rename), the
    directory this user's only (0700), at most ``MAX_EXPLAINED`` files kept, all through
    the directory's guarded handle (``plancache._neighbours.Directory``): a link planted as
    ``explain`` or in it is never followed, written through or pruned. The path; raises
    ``OSError`` (``PermissionError``: a directory another user could write)."""
    data = orjson.dumps({"factors": dict(factors), "labels": dict(labels)})
    with Directory.make(Path(local_dir), EXPLAIN_DIR, mode=0o700) as directory:
        directory.private(0o700)
        if directory.foreign is not None:
            raise PermissionError(f"not kept: {directory.foreign}")
        directory.write(f"{fp}.json", data)
        kept = []
        for name in directory.names():
            st = directory.lstat(name) if name.endswith(".json") else None
            if st is not None and stat.S_ISREG(st.st_mode):
                kept.append((st.st_mtime, name, st))
        for _, name, st in sorted(kept, reverse=True)[MAX_EXPLAINED:]:
            directory.remove(name, st)
        return directory.path / f"{fp}.json"


def as_scalars(factors: Mapping[str, object]) -> Mapping[str, Scalar]:
    """``factors`` as the plan store takes them (every value is a ``Scalar`` by its type)."""
    return cast("Mapping[str, Scalar]", factors)
