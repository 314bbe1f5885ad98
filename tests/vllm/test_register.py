"""Enabling and registration: when the plugin acts, and what ``register()`` patches."""

from __future__ import annotations

import json
import secrets
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

import plancache.integrations.vllm as plugin
from plancache._signing import key_id
from plancache.integrations.vllm import patch, registration, state
from plancache.testing import child_env
from tests.vllm.support import REPO, STANDIN, booted, load_standin, run_python, vllm_installed


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
        cache = state.current().cache
        if cache is not None and cache._opening is not None and cache._opening.value is not None:
            break
        time.sleep(0.01)
    cache = state.current().cache
    assert cache is not None and cache._opening is not None
    assert repr(cache._opening.value) == f"PlanStore(LocalStore({str(store_dir)!r}))"
    assert cache.store.url == str(store_dir)


def test_register_without_the_worker_module_warns(tmp_path: Path) -> None:
    code = "import plancache.integrations.vllm as p; p.register(); print('ok')"
    env = child_env(PLANCACHE_URL=str(tmp_path))
    if vllm_installed():
        pytest.skip("vllm is installed here")
    out = run_python(code, env, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok"
    assert out.stderr.count("plugin inactive") == 1


KEYED_BOOTS = """
import json, os
from pathlib import Path
import plancache.integrations.vllm as plugin
from plancache import Plan, open_store
from plancache.integrations.vllm.factors import as_scalars, worker_factors
from tests.vllm.support import booted, stored, use_fake_runtime

use_fake_runtime()
plugin.register()
from vllm.v1.worker import gpu_worker

def signers():
    return [p.signature and p.signature.keyid for p in stored(directory)]

directory = Path(os.environ["PLANCACHE_URL"])
first = gpu_worker.Worker()
booted(first)  # an empty store: it profiles
after_first = signers()
second = gpu_worker.Worker()
unsigned = Plan.new(as_scalars(worker_factors(second)), kv_cache_memory_bytes=20 << 30,
                    free_memory_baseline=70 << 30)
store = open_store(str(directory))
store.delete(unsigned.fingerprint)
store.put(unsigned)
booted(second)  # an unsigned plan it could apply
print(json.dumps({"after_first": after_first, "first": first.events, "second": second.events,
                  "after_second": signers()}))
"""
PROFILED = ["load_model", "memory-profiling", "warmup"]
"""A boot's events when it profiled and vLLM's built-in functions did nothing."""


def keyed_boots(tmp_path: Path, **env: str) -> tuple[dict[str, list[object]], str]:
    """Two boots in a fresh process with ``env``: one on an empty store, one on a store
    holding an unsigned plan it could apply; what each did and who signed what the store
    held after it, and the process's stderr."""
    child = child_env([STANDIN, REPO], PLANCACHE_URL=str(tmp_path / "plans"), **env)
    out = run_python(textwrap.dedent(KEYED_BOOTS), child, tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


def test_a_key_that_starts_with_a_hash_signs(tmp_path: Path) -> None:
    """In a fresh process: ``#`` starts no comment in a variable; that key signs what the
    boot records, and the unsigned plan is not applied."""
    key = "#" + secrets.token_hex(32)
    result, stderr = keyed_boots(tmp_path, PLANCACHE_SIGNING_KEY=key)
    assert result["first"] == result["second"] == PROFILED
    assert result["after_first"] == result["after_second"] == [key_id(key)]
    assert key not in stderr


@pytest.mark.parametrize("case", ["unicode-spaces", "empty", "comments-only-file"])
def test_key_settings_that_hold_no_key_turn_the_plugin_off(tmp_path: Path, case: str) -> None:
    """In a fresh process: a key variable that is set but yields no usable key never means
    "no signing": one ERROR line, then every boot profiles, applies no unsigned plan and
    records nothing (nor does vLLM's built-in save)."""
    key = secrets.token_hex(32)
    key_file = tmp_path / "keys"
    key_file.write_text(f"# {key}\n")
    key_file.chmod(0o600)
    env = {
        "unicode-spaces": {"PLANCACHE_SIGNING_KEY": "\u2003" * 24},
        "empty": {"PLANCACHE_SIGNING_KEY": ""},
        "comments-only-file": {"PLANCACHE_VERIFY_KEYS_FILE": str(key_file)},
    }[case]
    result, stderr = keyed_boots(tmp_path, **env)
    assert result["first"] == result["second"] == PROFILED
    assert result["after_first"] == []  # the profiled boot recorded nothing
    assert result["after_second"] == [None]  # the unsigned plan, neither applied nor changed
    assert stderr.count("plancache is off in this process") == 1, stderr
    assert "Traceback" not in stderr and key not in stderr
