"""Helpers shared by the vLLM plugin tests and the processes they start.

A child that imports this module needs ``REPO`` on its path. Never put ``tests/`` itself on
a path: its ``vllm`` folder would shadow the real vLLM.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from plancache import Plan, fingerprint, open_store
from plancache.integrations.vllm import factors
from plancache.integrations.vllm.factors import DeviceFactors, SoftwareFactors, as_scalars
from plancache.integrations.vllm.save import wait_saved
from plancache.integrations.vllm.worker import WorkerLike
from plancache.testing import GiB, child_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
"""The checkout's root: on a child's path, ``tests.vllm.support`` imports."""
STANDIN = HERE / "standin"
"""On a child's path, ``vllm`` is the stand-in package."""
STANDIN_GPU_WORKER = STANDIN / "vllm" / "v1" / "worker" / "gpu_worker.py"
GLOO_RANK = HERE / "gloo_rank.py"
REAL_WORKER = HERE / "real_worker.py"
"""Boots the real vLLM ``gpu_worker.Worker`` on CPU in its own process (``tox -e vllm``)."""
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "float32",
}
"""A tiny Llama: a real ``VllmConfig`` is built from a directory holding only this file."""
BOOT_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "GLOO_SOCKET_IFNAME": "lo",
}
"""What every boot of the real worker runs with."""
_counter = itertools.count()

if TYPE_CHECKING:  # the stand-in has every attribute the plugin reads
    from tests.vllm.standin.vllm.v1.worker import gpu_worker

    _standin_worker: WorkerLike = gpu_worker.Worker()


def vllm_installed() -> bool:
    """True if ``import vllm`` finds the real vLLM here, not this folder (which it finds when
    ``tests/`` is on the path, e.g. ``python -m pytest`` run inside ``tests/``)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None and Path(spec.origin).parent != HERE


def boot_env(**env: str) -> dict[str, str]:
    """A boot's environment: this process's without plancache's settings, ``BOOT_ENV`` and
    ``env``; ``REPO`` and the S3 client (s3fs) on its path."""
    return child_env([REPO, *_s3_client_path()], **{**BOOT_ENV, **env})


def _s3_client_path() -> list[str]:
    """Where this process found the S3 client (s3fs), so a child finds it too."""
    spec = importlib.util.find_spec("s3fs")
    if spec is None or spec.origin is None:
        return []
    return [str(Path(spec.origin).parent.parent)]


def fake_software_factors() -> SoftwareFactors:
    """What ``software_factors`` returns on a fixed, imaginary install (no vLLM, no torch)."""
    return {
        "vllm": "0.0.0+standin",
        "torch": "0.0.0",
        "cuda": "",
        "nccl": "",
        "estimate_cudagraphs": True,
        "vllm_env": "{}",
        "pytorch_cuda_alloc_conf": "",
        "pytorch_hip_alloc_conf": "",
        "pytorch_alloc_conf": "",
    }


def fake_device_factors(worker: WorkerLike) -> DeviceFactors:
    """What ``device_factors`` returns for any device of an imaginary GPU model."""
    return {
        "device_name": "Standin GPU",
        "device_total_memory": 96 * GiB,
        "device_capability": "9.0",
    }


def use_fake_runtime() -> None:
    """Make the plugin compute factors without vLLM or torch, in this process."""
    factors.software_factors = fake_software_factors
    factors.device_factors = fake_device_factors


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


def run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (60 s at most), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def booted(worker: Any) -> int:
    """``worker.boot()`` (a stand-in worker), then wait for its background save: the next
    boot in this process then sees it. The KV-cache bytes."""
    kv: int = worker.boot()
    wait_saved(worker, 10.0)
    return kv


def stored(directory: Path) -> list[Plan]:
    """Every plan in the local store at ``directory`` (wait for a worker's background save
    first: ``booted`` or ``wait_saved``)."""
    store = open_store(str(directory))
    return [p for fp in store.iter_fingerprints() if (p := store.get(fp)) is not None]


def key_of(worker: WorkerLike) -> str:
    """The fingerprint the plugin looks ``worker`` up under."""
    return fingerprint(as_scalars(factors.worker_factors(worker)))


def outcomes(*procs: Any, timeout: float) -> Iterator[tuple[int, dict[str, Any], str]]:
    """``procs``: ``subprocess.Popen`` or ``tests.vllm.launcher.Boot`` children. Each one's
    exit status, the last JSON object line of its stdout and its log
    (stdout and stderr), in order; all of them must end within ``timeout`` seconds (any
    left running is killed)."""
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [line for line in stdout.splitlines() if line.startswith("{")]
            assert lines, stderr[-4000:]
            yield proc.returncode, json.loads(lines[-1]), stdout + stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
