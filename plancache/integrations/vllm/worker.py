"""The vLLM worker as the plugin sees it: exactly the attributes it reads, and its memory
figures (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class CacheConfigLike(Protocol):
    """``vllm.config.CacheConfig``: the plugin reads both and sets ``kv_cache_memory_bytes``."""

    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float


class VllmConfigLike(Protocol):
    """``vllm.config.VllmConfig``."""

    def compute_hash(self) -> str: ...


class ParallelConfigLike(Protocol):
    """``vllm.config.ParallelConfig``."""

    @property
    def world_size(self) -> int: ...


class MemorySnapshotLike(Protocol):
    """``vllm.utils.mem_utils.MemorySnapshot``, taken in ``Worker.init_device``."""

    @property
    def free_memory(self) -> int: ...


class WorkerLike(Protocol):
    """``vllm.v1.worker.gpu_worker.Worker``, from ``init_device`` on. The plugin reads these
    attributes defensively: a worker that lacks one gets a profiled boot, never an error.
    ``available_kv_cache_memory_bytes`` exists only after a profiling run; ``requested_memory``
    (total memory x ``gpu_memory_utilization``) after ``init_device``; the model runner's
    ``model_memory_usage`` (the weights) after ``load_model``."""

    @property
    def cache_config(self) -> CacheConfigLike: ...
    @property
    def vllm_config(self) -> VllmConfigLike: ...
    @property
    def parallel_config(self) -> ParallelConfigLike: ...
    @property
    def rank(self) -> int: ...
    @property
    def local_rank(self) -> int:
        """The logical device id (vLLM's ``get_local_gpu_index``)."""
        ...

    @property
    def device(self) -> object:
        """The torch device; its ``index`` is the visible device id."""
        ...

    @property
    def init_snapshot(self) -> MemorySnapshotLike: ...
    @property
    def available_kv_cache_memory_bytes(self) -> int: ...


@dataclass(frozen=True)
class MemoryFigures:
    """What the worker itself measured, for plausibility checks of a plan; None where the
    worker does not have it (yet)."""

    requested_memory: int | None
    """``ceil(total memory x gpu_memory_utilization)``: the KV cache fits below it."""
    weights_memory: int | None
    """Bytes the weights took (``model_runner.model_memory_usage``), known after loading."""


def memory_figures(worker: object) -> MemoryFigures:
    """``worker``'s memory figures; cheap attribute reads, never raises."""

    def size(value: object) -> int | None:
        return value if type(value) is int else None

    runner = getattr(worker, "model_runner", None)
    return MemoryFigures(
        requested_memory=size(getattr(worker, "requested_memory", None)),
        weights_memory=size(getattr(runner, "model_memory_usage", None)),
    )
