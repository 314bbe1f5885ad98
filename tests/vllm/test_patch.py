"""The import hook and the method wrappers, on the stand-in ``gpu_worker`` module."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import plancache.integrations.vllm as plugin
from plancache.integrations.vllm import patch
from plancache.testing import child_env
from tests.vllm.support import REPO, STANDIN, load_standin, run_python


def test_patching_keeps_signatures(gpu: ModuleType) -> None:
    fresh = load_standin()
    for name in plugin.WRAPPED_METHODS:
        method = getattr(gpu.Worker, name)
        assert inspect.signature(method) == inspect.signature(getattr(fresh.Worker, name))
        assert method.__name__ == name and method.__doc__ == getattr(fresh.Worker, name).__doc__


def test_missing_methods_warn_once_and_patch_nothing(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = ModuleType("old_gpu_worker")

    class Worker:
        def determine_available_memory(self) -> int:
            return 1

    module.Worker = Worker  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="plancache"):
        assert plugin.patch_worker_module(module) is False
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "compile_or_warm_up_model" in caplog.text
    assert not hasattr(Worker.determine_available_memory, patch.MARK)


def test_unrecognised_internals_are_named() -> None:
    def same(self: object, module_hash: str, extra: int = 0) -> None: ...

    def renamed(self: object, digest: str) -> None: ...

    def keyword_only(self: object, *, module_hash: str) -> None: ...

    expected = ("self", "module_hash")
    assert patch.unrecognised({"a": (same, expected)}) is None
    off = patch.unrecognised(
        {
            "gone": (None, expected),
            "renamed": (renamed, expected),
            "keyword": (keyword_only, expected),
            "value": (3, expected),
        }
    )
    assert off == (
        "gone is missing; renamed takes (self, digest), not (self, module_hash, ...); "
        "keyword takes (self, module_hash), not (self, module_hash, ...); value is missing"
    )


def test_register_patches_lazily_on_import(tmp_path: Path) -> None:
    """In a fresh process: importing the plugin and register() import nothing heavy; the
    worker module is patched when vLLM imports it, through its normal import."""
    code = textwrap.dedent(
        """
        import sys, inspect
        import plancache.integrations.vllm as plugin
        from plancache.integrations.vllm import patch
        assert not {"vllm", "torch"} & set(sys.modules)
        plugin.register()
        plugin.register()
        assert "vllm.v1.worker.gpu_worker" not in sys.modules
        from vllm.v1.worker import gpu_worker
        w = gpu_worker.Worker.determine_available_memory
        assert w.__plancache_wrapped__ and not hasattr(w.__wrapped__, "__plancache_wrapped__")
        assert gpu_worker.maybe_save_startup_plan.__plancache_wrapped__
        assert not any(isinstance(f, patch.PatchOnImport) for f in sys.meta_path)
        assert inspect.getsource(gpu_worker).startswith('\"\"\"Stand-in')
        print("ok")
        """
    )
    env = child_env([STANDIN, REPO], PLANCACHE_URL=str(tmp_path / "plans"))
    out = run_python(code, env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_import_hooks_for_one_module_neither_pile_up_nor_recurse(tmp_path: Path) -> None:
    """Registering again (a second copy of the plugin, a test) hooks a module once, and two
    hooks for one module, however they got there, do not ask each other forever."""
    (tmp_path / "hooked_module.py").write_text("VALUE = 1\n")
    loaded: list[ModuleType] = []
    before = list(sys.meta_path)
    sys.path.insert(0, str(tmp_path))
    try:
        patch.patch_on_import("hooked_module", loaded.append)
        patch.patch_on_import("hooked_module", loaded.append)
        assert len(sys.meta_path) == len(before) + 1
        sys.meta_path.insert(0, patch.PatchOnImport("hooked_module", loaded.append))
        assert importlib.util.find_spec("hooked_module") is not None  # no RecursionError
        module = importlib.import_module("hooked_module")
        assert loaded == [module]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hooked_module", None)
        sys.meta_path[:] = before
