"""The vLLM plugin on a stand-in worker (no vLLM needed), plus the gloo rank agreement."""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import plancache.integrations.vllm as plugin
from plancache import Plan, PlanCache, open_store
from tests.vllm_support import (
    ENV_VARS,
    STANDIN,
    TESTS,
    GiB,
    child_env,
    fake_device_factors,
    fake_software_factors,
    load_standin,
)

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A clean plugin (enabled on a local store in tmp_path) with stand-in factors."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "plans"
    monkeypatch.setenv("PLANCACHE_URL", str(directory))
    monkeypatch.setattr(plugin, "_cache", None)
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "software_factors", fake_software_factors)
    monkeypatch.setattr(plugin, "device_factors", fake_device_factors)
    ours = logging.getLogger("plancache")  # register() may route it to vLLM's handler
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    yield directory


@pytest.fixture
def gpu(store_dir: Path) -> ModuleType:
    """A fresh stand-in ``gpu_worker`` module, patched."""
    module = load_standin()
    assert plugin.patch_worker_module(module)
    return module


def stored(directory: Path) -> list[Plan]:
    store = open_store(str(directory))
    return [p for fp in store.iter_fingerprints() if (p := store.get(fp)) is not None]


def key_of(worker: object) -> str:
    from plancache import fingerprint

    return fingerprint(plugin.worker_factors(worker))


def test_miss_profiles_and_saves(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB)
    key = key_of(worker)
    assert worker.boot() == 30 * GiB
    assert "memory-profiling" in worker.events
    [plan] = stored(store_dir)
    assert plan.fingerprint == key
    assert (plan.kv_cache_memory_bytes, plan.free_memory_baseline) == (30 * GiB, 80 * GiB)


def test_hit_skips_profiling_with_the_profiled_kv(gpu: ModuleType) -> None:
    first = gpu.Worker(profiled_kv=30 * GiB + 12345)
    profiled = first.boot()
    second = gpu.Worker(profiled_kv=1)  # would profile something else
    assert second.boot() == profiled
    assert "memory-profiling" not in second.events
    assert second.cache_config.kv_cache_memory_bytes == profiled


def test_builtin_startup_plan_neither_applies_nor_saves(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLANCACHE_URL")
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(store_dir.parent / "vllm-cache"))
    worker = gpu.Worker()
    worker.boot()
    assert not {"builtin-apply", "builtin-save"} & set(worker.events)
    assert len(stored(store_dir.parent / "vllm-cache" / "startup_plan")) == 1


def test_explicit_value_respected(gpu: ModuleType, store_dir: Path) -> None:
    gpu.Worker(profiled_kv=30 * GiB).boot()  # a plan that would apply
    worker = gpu.Worker(kv_cache_memory_bytes=7 * GiB)
    assert worker.boot() == 7 * GiB
    assert worker.cache_config.kv_cache_memory_bytes == 7 * GiB
    [plan] = stored(store_dir)
    assert plan.kv_cache_memory_bytes == 30 * GiB


def test_gate_rejects_plan_from_a_roomier_boot(
    gpu: ModuleType, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB).boot()
    worker = gpu.Worker(free_memory=70 * GiB, profiled_kv=20 * GiB)
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert worker.boot() == 20 * GiB
    assert "memory-profiling" in worker.events
    assert "gate:free-memory-below-baseline" in caplog.text
    [plan] = stored(store_dir)  # 20 GiB at 70 does not dominate 30 GiB at 80
    assert plan.kv_cache_memory_bytes == 30 * GiB


def test_store_error_profiles(
    gpu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("PLANCACHE_URL", str(not_a_dir))
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert worker.boot() == 30 * GiB
    assert "memory-profiling" in worker.events


def test_stalled_store_profiles_within_budget(
    gpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stalled:
        def get(self, fp: str) -> None:
            time.sleep(30)

        def put(self, plan: Plan) -> None:
            time.sleep(30)

    monkeypatch.setattr(plugin, "_cache", PlanCache(lambda: Stalled(), timeout=0.3))  # type: ignore[arg-type,return-value]
    worker = gpu.Worker(profiled_kv=30 * GiB)
    start = time.perf_counter()
    assert worker.boot() == 30 * GiB
    assert time.perf_counter() - start < 2.0  # lookup and record, 0.3 s each
    assert "memory-profiling" in worker.events


def test_save_key_is_lookup_key_though_config_changes(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker()
    before = worker.vllm_config.compute_hash()
    decision = plugin.maybe_apply_startup_plan(worker)
    assert decision is not None and decision.reason == "miss"
    worker.determine_available_memory()
    worker.compile_or_warm_up_model()
    assert worker.vllm_config.compute_hash() != before  # resolved during startup
    [plan] = stored(store_dir)
    assert plan.fingerprint == decision.fingerprint
    again = gpu.Worker()
    again.boot()
    assert "memory-profiling" not in again.events


def test_gpu_memory_utilization_is_part_of_the_key(gpu: ModuleType) -> None:
    gpu.Worker(gpu_memory_utilization=0.9, profiled_kv=60 * GiB).boot()
    half = gpu.Worker(gpu_memory_utilization=0.5, profiled_kv=30 * GiB)
    assert half.boot() == 30 * GiB
    assert "memory-profiling" in half.events


def test_device_factors_read_the_workers_own_device(
    gpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def device_factors(device: object) -> dict[str, object]:
        seen.append(device)
        return fake_device_factors(device)

    monkeypatch.setattr(plugin, "device_factors", device_factors)
    gpu.Worker(rank=3, world_size=1).boot()
    assert seen == ["cuda:3"]


def test_factors_cover_the_documented_inputs(gpu: ModuleType) -> None:
    factors = plugin.worker_factors(gpu.Worker(rank=1, world_size=2))
    assert set(factors) == {
        "vllm",
        "torch",
        "cuda",
        "estimate_cudagraphs",
        "device_name",
        "device_total_memory",
        "device_capability",
        "vllm_config",
        "gpu_memory_utilization",
        "rank",
        "world_size",
    }
    assert (factors["rank"], factors["world_size"]) == (1, 2)


def test_no_save_when_warmup_fails(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(fail_warmup=True)
    worker.determine_available_memory()
    with pytest.raises(RuntimeError):
        worker.compile_or_warm_up_model()
    assert stored(store_dir) == []


def test_factor_errors_profile_and_save_nothing(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: object) -> dict[str, object]:
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(plugin, "device_factors", broken)
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert worker.boot() == 30 * GiB
    assert stored(store_dir) == []


def test_public_functions_follow_vllms_semantics(gpu: ModuleType, store_dir: Path) -> None:
    worker = gpu.Worker(profiled_kv=30 * GiB)
    assert plugin.maybe_apply_startup_plan(worker) is not None  # a miss
    assert worker.cache_config.kv_cache_memory_bytes is None
    recorded = plugin.maybe_save_startup_plan(worker, 29 * GiB)
    assert recorded is not None and recorded.reason == "created"
    assert plugin.maybe_save_startup_plan(worker, 29 * GiB) is None  # once per boot
    hit = gpu.Worker()
    decision = plugin.maybe_apply_startup_plan(hit)
    assert decision is not None and decision.reason == "hit"
    assert hit.cache_config.kv_cache_memory_bytes == 29 * GiB
    assert plugin.maybe_save_startup_plan(hit, 1 * GiB) is None  # applied: never saves
    explicit = gpu.Worker(kv_cache_memory_bytes=5 * GiB)
    assert plugin.maybe_apply_startup_plan(explicit) is None
    assert plugin.maybe_save_startup_plan(explicit, 5 * GiB) is None
    no_lookup = gpu.Worker(profiled_kv=31 * GiB)  # a key made now could be one no lookup makes
    assert plugin.maybe_save_startup_plan(no_lookup, 31 * GiB) is None
    assert [p.kv_cache_memory_bytes for p in stored(store_dir)] == [29 * GiB]


def test_public_functions_never_raise(store_dir: Path) -> None:
    assert plugin.maybe_apply_startup_plan(object()) is None
    assert plugin.maybe_save_startup_plan(object(), GiB) is None


def test_public_functions_do_nothing_when_disabled(
    gpu: ModuleType, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANCACHE_ENABLE", "0")
    worker = gpu.Worker()
    assert plugin.maybe_apply_startup_plan(worker) is None
    assert plugin.maybe_save_startup_plan(worker, GiB) is None
    assert stored(store_dir) == []


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
        getattr(getattr(module.Worker, m), "__plancache_wrapped__", False)
        for m in plugin.WRAPPED_METHODS
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
    monkeypatch.setattr(plugin, "_registered", False)  # as if a second copy registered
    plugin.register()
    assert module.Worker.determine_available_memory.__wrapped__ is original
    assert module.maybe_apply_startup_plan is plugin._builtin_replaced
    worker = module.Worker()
    worker.boot()
    assert worker.events.count("memory-profiling") == 1


def test_register_opens_the_store_before_any_lookup(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_as_vllm(monkeypatch, load_standin())
    plugin.register()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        cache = plugin._cache
        if cache is not None and cache._store is not None:
            break
        time.sleep(0.01)
    assert plugin._cache is not None and plugin._cache._store is not None
    assert plugin._cache.store.url == str(store_dir)


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
    assert not hasattr(Worker.determine_available_memory, "__plancache_wrapped__")


def test_register_patches_lazily_on_import(tmp_path: Path) -> None:
    """In a fresh process: register() imports nothing heavy; the worker module is patched
    when vLLM imports it, through its normal import."""
    code = textwrap.dedent(
        """
        import sys, inspect
        import plancache.integrations.vllm as plugin
        plugin.register()
        plugin.register()
        assert "vllm.v1.worker.gpu_worker" not in sys.modules
        from vllm.v1.worker import gpu_worker
        w = gpu_worker.Worker.determine_available_memory
        assert w.__plancache_wrapped__ and not hasattr(w.__wrapped__, "__plancache_wrapped__")
        assert gpu_worker.maybe_save_startup_plan is plugin._builtin_replaced
        assert not any(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path)
        assert inspect.getsource(gpu_worker).startswith('\"\"\"Stand-in')
        print("ok")
        """
    )
    env = child_env([STANDIN], PLANCACHE_URL=str(tmp_path / "plans"))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_register_without_the_worker_module_warns(tmp_path: Path) -> None:
    code = "import plancache.integrations.vllm as p; p.register(); print('ok')"
    env = child_env([], PLANCACHE_URL=str(tmp_path))
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok"
    assert out.stderr.count("plugin inactive") == 1


# --------------------------------------------------------------------------- gloo


def _boot_ranks(
    store: Path,
    rendezvous: Path,
    free: list[int],
    timeout: float = 30.0,
    idle: frozenset[int] = frozenset(),
) -> list[dict[str, object]]:
    """Boot one stand-in worker per rank in its own process (gloo); their JSON reports."""
    env = child_env([TESTS], PLANCACHE_URL=str(store), GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(TESTS / "gloo_rank.py"),
                str(rank),
                str(len(free)),
                str(rendezvous),
                str(mem),
                str(timeout),
                *(["idle"] if rank in idle else []),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, mem in enumerate(free)
    ]
    reports = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr
            reports.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports


def _seed(store: Path, gpu: ModuleType, rank: int, world: int, baseline: int) -> None:
    """A 20 GiB plan for ``rank`` recorded at ``baseline`` free bytes."""
    worker = gpu.Worker(rank=rank, world_size=world)
    plan = Plan.new(
        plugin.worker_factors(worker),
        kv_cache_memory_bytes=20 * GiB,
        free_memory_baseline=baseline,
    )
    open_store(str(store)).put(plan)


needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (tox -e vllm)")


@needs_torch
def test_ranks_apply_together(gpu: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "both-pass"
    _seed(store, gpu, 0, 2, baseline=60 * GiB)
    _seed(store, gpu, 1, 2, baseline=60 * GiB)
    reports = _boot_ranks(store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB])
    assert all("memory-profiling" not in r["events"] for r in reports)  # type: ignore[operator]
    assert [r["kv"] for r in reports] == [20 * GiB, 20 * GiB]


@needs_torch
def test_one_gate_fails_so_no_rank_applies(gpu: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "one-passes"
    _seed(store, gpu, 0, 2, baseline=60 * GiB)
    _seed(store, gpu, 1, 2, baseline=90 * GiB)  # rank 1 has only 80 GiB free
    reports = _boot_ranks(store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB])
    assert all("memory-profiling" in r["events"] for r in reports)  # type: ignore[operator]


@needs_torch
def test_failed_agreement_means_profiling(gpu: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "peer-absent"
    _seed(store, gpu, 0, 2, baseline=60 * GiB)
    rank0, _idle = _boot_ranks(
        store, tmp_path / "rendezvous", [80 * GiB, 80 * GiB], timeout=2.0, idle=frozenset({1})
    )
    assert "memory-profiling" in rank0["events"]  # type: ignore[operator]
    assert rank0["seconds"] < 20  # type: ignore[operator]
