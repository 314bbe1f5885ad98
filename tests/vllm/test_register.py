"""Enabling and registration: when the plugin acts, and what ``register()`` patches."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

import plancache.integrations.vllm as plugin
from plancache.integrations.vllm import apply, patch, registration
from plancache.testing import child_env
from tests.vllm.support import booted, load_standin, run_python, vllm_installed


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"PLANCACHE_URL": "s3://b/p"}, True),
        ({"VLLM_ENABLE_STARTUP_PLAN": "1"}, True),
        ({"VLLM_ENABLE_STARTUP_PLAN": "0"}, False),
        ({"PLANCACHE_ENABLE": "1"}, True),
        ({"PLANCACHE_ENABLE": "0", "PLANCACHE_URL": "s3://b/p"}, False),
        ({"PLANCACHE_ENABLE": "off", "VLLM_ENABLE_STARTUP_PLAN": "1"}, False),
        ({"PLANCACHE_ENABLE": "maybe", "PLANCACHE_URL": "s3://b/p"}, False),
    ],
)
def test_enabled(env: dict[str, str], expected: bool) -> None:
    assert plugin.enabled(env) is expected


def _install_as_vllm(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> None:
    monkeypatch.setitem(sys.modules, plugin.TARGET_MODULE, module)


def _wrapped(module: ModuleType) -> bool:
    return any(
        getattr(getattr(module.Worker, m), patch.MARK, False) for m in plugin.WRAPPED_METHODS
    )


@pytest.mark.parametrize(
    "env", [{"PLANCACHE_URL": ""}, {"PLANCACHE_ENABLE": "0"}], ids=["not-enabled", "enable-0"]
)
def test_register_patches_nothing_unless_enabled(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    module = load_standin()
    _install_as_vllm(monkeypatch, module)
    plugin.register()
    assert not _wrapped(module)
    assert module.maybe_apply_startup_plan.__name__ == "maybe_apply_startup_plan"


def test_register_is_idempotent(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_standin()
    original = module.Worker.determine_available_memory
    _install_as_vllm(monkeypatch, module)
    plugin.register()
    plugin.register()
    monkeypatch.setattr(registration, "_registered", False)  # as if a second copy registered
    plugin.register()
    assert module.Worker.determine_available_memory.__wrapped__ is original
    assert getattr(module.maybe_apply_startup_plan, patch.MARK, False)
    worker = module.Worker()
    booted(worker)
    assert worker.events.count("memory-profiling") == 1


def test_register_opens_the_store_before_any_lookup(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_as_vllm(monkeypatch, load_standin())
    plugin.register()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        cache = apply._cache
        if cache is not None and cache._store is not None:
            break
        time.sleep(0.01)
    assert apply._cache is not None and apply._cache._store is not None
    assert apply._cache.store.url == str(store_dir)


def test_register_without_the_worker_module_warns(tmp_path: Path) -> None:
    code = "import plancache.integrations.vllm as p; p.register(); print('ok')"
    env = child_env(PLANCACHE_URL=str(tmp_path))
    if vllm_installed():
        pytest.skip("vllm is installed here")
    out = run_python(code, env, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok"
    assert out.stderr.count("plugin inactive") == 1
