"""Factors keyed like a real boot's: the vLLM plugin's own ``WorkerFactors``."""

from __future__ import annotations

import hashlib

from plancache._keys import Scalar
from plancache.integrations.vllm.factors import WorkerFactors, as_scalars


def worker_factors(config: str) -> dict[str, Scalar]:
    """The factors the vLLM plugin keys rank 0 of a one-GPU H200 boot by, for the engine
    configuration named ``config`` (its ``VllmConfig.compute_hash()`` is derived from it)."""
    factors = WorkerFactors(
        vllm="0.33.0",
        torch="2.13.0",
        cuda="13.0",
        estimate_cudagraphs=True,
        device_name="NVIDIA H200",
        device_total_memory=150_110_011_392,
        device_capability="9.0",
        vllm_config=hashlib.sha256(config.encode()).hexdigest()[:10],
        gpu_memory_utilization=0.9,
        rank=0,
        world_size=1,
        nccl="2.27.3",
        pytorch_cuda_alloc_conf="",
        pytorch_hip_alloc_conf="",
        pytorch_alloc_conf="",
        vllm_env="{}",
        disable_custom_all_reduce=False,
    )
    return dict(as_scalars(factors))
