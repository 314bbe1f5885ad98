"""Stand-in for ``vllm.v1.worker.gpu_worker`` (vLLM 0.33.0): the same names, methods and
attributes that plancache's plugin uses, with a "profiling" that records that it ran, and
the memory figures vLLM's worker has (``requested_memory`` from ``init_device``, the model
runner's ``model_memory_usage`` once ``load_model`` ran).

Like vLLM, ``determine_available_memory`` calls the built-in ``maybe_apply_startup_plan``
first and skips memory profiling when ``cache_config.kv_cache_memory_bytes`` is set;
``compile_or_warm_up_model`` resolves config values during startup (which changes
``VllmConfig.compute_hash()``) and calls the built-in ``maybe_save_startup_plan``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from plancache._units import GiB


def maybe_apply_startup_plan(worker: Worker) -> None:
    worker.events.append("builtin-apply")


def maybe_save_startup_plan(worker: Worker, kv_cache_memory_bytes: int) -> None:
    worker.events.append("builtin-save")


@dataclass
class CacheConfig:
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None


@dataclass
class ParallelConfig:
    world_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclass
class ModelConfig:
    model: str = "standin/model"
    dtype: str = "bfloat16"


@dataclass
class VllmConfig:
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    model_config: ModelConfig = field(default_factory=ModelConfig)
    max_model_len: int | None = None
    cudagraph_mode: str | None = None

    def compute_hash(self) -> str:
        """Like vLLM's: no gpu_memory_utilization, no kv_cache_memory_bytes, no device."""
        text = f"{self.model_config.model}|{self.max_model_len}|{self.cudagraph_mode}"
        text += f"|{self.parallel_config.world_size}"
        return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass
class MemorySnapshot:
    free_memory: int
    total_memory: int


@dataclass
class ModelRunner:
    model_memory_usage: int = 0


@dataclass
class Worker:
    rank: int = 0
    world_size: int = 1
    free_memory: int = 80 * GiB
    total_memory: int = 96 * GiB
    weights_memory: int = 16 * GiB
    profiled_kv: int = 30 * GiB
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    fail_warmup: bool = False
    events: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.local_rank = self.rank
        self.device = f"cuda:{self.local_rank}"
        self.cache_config = CacheConfig(self.gpu_memory_utilization, self.kv_cache_memory_bytes)
        self.parallel_config = ParallelConfig(self.world_size, self.world_size)
        self.vllm_config = VllmConfig(self.cache_config, self.parallel_config)
        self.init_snapshot = MemorySnapshot(self.free_memory, self.total_memory)
        self.requested_memory = math.ceil(self.total_memory * self.gpu_memory_utilization)
        self.model_runner = ModelRunner()

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        """Load the weights (nothing to load here, but they count)."""
        self.events.append("load_model")
        self.model_runner.model_memory_usage = self.weights_memory

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: the configured value, or a "profiled" one."""
        maybe_apply_startup_plan(self)
        if kv_cache_memory_bytes := self.cache_config.kv_cache_memory_bytes:
            self.events.append("profile_run")
            return kv_cache_memory_bytes
        self.events.append("memory-profiling")
        self.available_kv_cache_memory_bytes = self.profiled_kv
        return int(self.available_kv_cache_memory_bytes)

    def compile_or_warm_up_model(self) -> float:
        """Warm up; resolves config values the way vLLM does during startup."""
        self.events.append("warmup")
        self.vllm_config.max_model_len = 4096
        self.vllm_config.cudagraph_mode = "FULL_AND_PIECEWISE"
        if self.fail_warmup:
            raise RuntimeError("CUDA out of memory (stand-in)")
        if self.cache_config.kv_cache_memory_bytes is None:
            maybe_save_startup_plan(self, self.available_kv_cache_memory_bytes - 150 * (1 << 20))
        return 0.0

    def boot(self) -> int:
        """The three calls vLLM's engine makes, in order; the KV-cache bytes."""
        self.load_model()
        kv = self.determine_available_memory()
        self.compile_or_warm_up_model()
        return kv
