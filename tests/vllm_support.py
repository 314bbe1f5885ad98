"""Helpers shared by the vLLM plugin tests and the processes they start."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path
from types import ModuleType

from plancache.plan import Scalar

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
STANDIN = TESTS / "standin"
STANDIN_GPU_WORKER = STANDIN / "vllm" / "v1" / "worker" / "gpu_worker.py"
GiB = 1 << 30
ENV_VARS = (
    "PLANCACHE_URL",
    "PLANCACHE_ENABLE",
    "PLANCACHE_TIMEOUT",
    "PLANCACHE_READ_ONLY",
    "PLANCACHE_LOCAL_TIER",
    "PLANCACHE_STORAGE_OPTIONS",
    "VLLM_ENABLE_STARTUP_PLAN",
)
_counter = itertools.count()


def fake_software_factors() -> dict[str, Scalar]:
    """What ``software_factors`` returns on a fixed, imaginary install (no vLLM, no torch)."""
    return {"vllm": "0.0.0+standin", "torch": "0.0.0", "cuda": "", "estimate_cudagraphs": True}


def fake_device_factors(device: object) -> dict[str, Scalar]:
    """What ``device_factors`` returns for any device of an imaginary GPU model."""
    return {
        "device_name": "Standin GPU",
        "device_total_memory": 96 * GiB,
        "device_capability": "9.0",
    }


def use_fake_runtime(plugin: ModuleType) -> None:
    """Make ``plugin`` (``plancache.integrations.vllm``) compute factors without vLLM/torch."""
    plugin.software_factors = fake_software_factors  # type: ignore[attr-defined]
    plugin.device_factors = fake_device_factors  # type: ignore[attr-defined]


def load_standin() -> ModuleType:
    """A fresh copy of the stand-in ``gpu_worker`` module (its own, unpatched ``Worker``)."""
    spec = importlib.util.spec_from_file_location(
        f"standin_gpu_worker_{next(_counter)}", STANDIN_GPU_WORKER
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def child_env(pythonpath: list[Path], **extra: str) -> dict[str, str]:
    """The environment for a child process: no plancache/vLLM plan settings but ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*pythonpath, REPO])
    env.update(extra)
    return env
