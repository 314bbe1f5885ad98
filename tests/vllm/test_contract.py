"""Contract tests against the real vLLM 0.33.0 (``tox -e vllm``; skipped where it is absent).

The engine cannot boot without a GPU, so these check what the plugin relies on: discovery
through ``load_general_plugins``, the real ``gpu_worker.Worker`` and its methods, the
attributes they set, and fingerprints of real ``VllmConfig`` objects.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plancache.testing import child_env
from tests.vllm.support import MODEL_CONFIG, REPO, vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
]

VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}


def run_python(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def last_json(proc: subprocess.Popen[str]) -> dict[str, object]:
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-4000:]
    result: dict[str, object] = json.loads(stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("allow", [None, "plancache"], ids=["all-plugins", "VLLM_PLUGINS"])
def test_load_general_plugins_wraps_the_real_worker(tmp_path: Path, allow: str | None) -> None:
    extra = {**VLLM_ENV, "PLANCACHE_URL": str(tmp_path)}
    if allow is not None:
        extra["VLLM_PLUGINS"] = allow
    code = """
        import inspect, json, logging, sys
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import plancache.integrations.vllm as plugin
        from plancache.integrations.vllm import patch, registration
        assert registration._registered
        assert "vllm.v1.worker.gpu_worker" not in sys.modules
        from vllm.v1.worker import gpu_worker
        report = {}
        for name in plugin.WRAPPED_METHODS:
            method = getattr(gpu_worker.Worker, name)
            original = method.__wrapped__
            report[name] = {
                "wrapped": getattr(method, "__plancache_wrapped__", False),
                "same_signature": inspect.signature(method) == inspect.signature(original),
                "signature": str(inspect.signature(method)),
                "same_names": (method.__name__, method.__qualname__, method.__doc__)
                == (original.__name__, original.__qualname__, original.__doc__),
            }
        report["builtins_replaced"] = all(
            getattr(getattr(gpu_worker, f), patch.MARK, False) for f in plugin.BUILTIN_FUNCTIONS
        )
        handlers = logging.getLogger("plancache").handlers
        report["logs_via_vllm"] = [type(h).__name__ for h in handlers] == ["_ForwardTo"]
        print(json.dumps(report))
    """
    report = last_json(run_python(code, child_env([], **extra)))
    for name in ("load_model", "determine_available_memory", "compile_or_warm_up_model"):
        assert report[name] == {
            "wrapped": True,
            "same_signature": True,
            "signature": report[name]["signature"],  # type: ignore[index]
            "same_names": True,
        }
    assert report["determine_available_memory"]["signature"] == "(self) -> int"  # type: ignore[index]
    assert report["builtins_replaced"] is True
    assert report["logs_via_vllm"] is True


def test_not_enabled_leaves_the_real_worker_alone(tmp_path: Path) -> None:
    code = """
        import json
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        from vllm.v1.worker import gpu_worker
        method = gpu_worker.Worker.determine_available_memory
        print(json.dumps({"wrapped": hasattr(method, "__plancache_wrapped__")}))
    """
    env = child_env([], **VLLM_ENV, PLANCACHE_ENABLE="0", PLANCACHE_URL=str(tmp_path))
    assert last_json(run_python(code, env)) == {"wrapped": False}


def test_fingerprints_of_real_configs(tmp_path: Path) -> None:
    """0.9 and 0.5 differ although ``compute_hash()`` does not; another process agrees."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    code = f"""
        import json
        from types import SimpleNamespace
        from vllm.engine.arg_utils import EngineArgs
        import plancache.integrations.vllm as plugin
        from plancache import fingerprint
        from plancache.integrations.vllm import factors as plugin_factors
        from tests.vllm.support import fake_device_factors
        plugin_factors.device_factors = fake_device_factors  # no GPU here
        out = {{}}
        for util in (0.9, 0.5):
            cfg = EngineArgs(
                model={str(model)!r}, skip_tokenizer_init=True, load_format="dummy",
                enforce_eager=True, gpu_memory_utilization=util,
            ).create_engine_config()
            worker = SimpleNamespace(
                vllm_config=cfg, cache_config=cfg.cache_config,
                parallel_config=cfg.parallel_config, rank=0, device="cuda:0",
            )
            factors = plugin.worker_factors(worker)
            out[str(util)] = {{"fp": fingerprint(factors), "hash": cfg.compute_hash(),
                               "factors": factors}}
        print(json.dumps(out))
    """
    env = child_env([REPO], **VLLM_ENV)
    first, second = (run_python(code, env) for _ in range(2))
    a, b = last_json(first), last_json(second)
    high, low = a["0.9"], a["0.5"]
    assert high["hash"] == low["hash"]  # type: ignore[index]  # vLLM's key misses it
    assert high["fp"] != low["fp"]  # type: ignore[index]
    assert b == a
    factors = high["factors"]  # type: ignore[index]
    assert factors["vllm"] == "0.33.0"
    assert factors["torch"].startswith("2.13.0")
    assert factors["estimate_cudagraphs"] is True
    assert factors["gpu_memory_utilization"] == 0.9


def _self_assignments(function: object) -> set[str]:
    """Names of the ``self.X`` attributes that ``function``'s source assigns."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def test_real_worker_still_has_what_the_plugin_uses() -> None:
    """Guards upstream drift of the code the plugin wraps and the attributes it reads."""
    from vllm.v1.worker import gpu_worker, worker_base

    worker = gpu_worker.Worker
    determine = inspect.unwrap(worker.determine_available_memory)
    assert "available_kv_cache_memory_bytes" in _self_assignments(determine)
    source = inspect.getsource(determine)
    assert "self.cache_config.kv_cache_memory_bytes" in source
    assert "maybe_apply_startup_plan(self)" in source
    assert {"init_snapshot", "device", "requested_memory"} <= _self_assignments(worker.init_device)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # the plausibility figures: requested memory (above) and the weights
    assert "model_memory_usage" in _self_assignments(GPUModelRunner.load_model)
    assert {"vllm_config", "cache_config", "parallel_config", "rank"} <= _self_assignments(
        worker_base.WorkerBase.__init__
    )
    assert "maybe_save_startup_plan" in inspect.getsource(
        inspect.unwrap(worker._compile_or_warm_up_model)
    )
    assert callable(worker.compile_or_warm_up_model)
    from vllm.config import CacheConfig

    fields = CacheConfig.__dataclass_fields__
    assert {"kv_cache_memory_bytes", "gpu_memory_utilization"} <= set(fields)
