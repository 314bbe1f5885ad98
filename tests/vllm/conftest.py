"""Fixtures of the plugin tests: a clean plugin on a local store, stand-in workers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import plancache.integrations.vllm as plugin
from plancache.integrations.vllm import factors, registration, state
from plancache.testing import SETTINGS_VARS
from tests.vllm.launcher import Launcher
from tests.vllm.support import boot_env, fake_device_factors, fake_software_factors, load_standin


@pytest.fixture
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A clean plugin (enabled on a local store in tmp_path) with stand-in factors."""
    for name in SETTINGS_VARS:
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "plans"
    monkeypatch.setenv("PLANCACHE_URL", str(directory))
    monkeypatch.setattr(registration, "_registered", False)
    monkeypatch.setattr(factors, "software_factors", fake_software_factors)
    monkeypatch.setattr(factors, "device_factors", fake_device_factors)
    ours = logging.getLogger("plancache")  # register() may route it to vLLM's handler
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    previous = state.use(state.Plugin())  # this test's own plugin state
    yield directory
    state.use(previous)


@pytest.fixture
def gpu(store_dir: Path) -> ModuleType:
    """A fresh stand-in ``gpu_worker`` module, patched."""
    module = load_standin()
    assert plugin.patch_worker_module(module)
    return module


@pytest.fixture(scope="session")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Forks fresh processes from one that imported torch and vLLM once (real vLLM only)."""
    with Launcher(tmp_path_factory.mktemp("launcher"), boot_env()) as started:
        yield started
