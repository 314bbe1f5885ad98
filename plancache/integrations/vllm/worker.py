"""The vLLM worker as the plugin sees it: exactly the attributes it reads (pure typing)."""

from __future__ import annotations

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
    ``available_kv_cache_memory_bytes`` exists only after a profiling run."""

    @property
    def cache_config(self) -> CacheConfigLike: ...
    @property
    def vllm_config(self) -> VllmConfigLike: ...
    @property
    def parallel_config(self) -> ParallelConfigLike: ...
    @property
    def rank(self) -> int: ...
    @property
    def device(self) -> object: ...
    @property
    def init_snapshot(self) -> MemorySnapshotLike: ...
    @property
    def available_kv_cache_memory_bytes(self) -> int: ...
