"""The plugin's ``boot`` events on a stand-in worker (no vLLM needed), as the benchmarks read
them from a child's standard error (``PLANCACHE_EVENTS=1``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks.boot import decisions
from plancache import Plan, open_store
from plancache import _events as events
from plancache.integrations.vllm import apply, factors
from plancache.integrations.vllm.factors import as_scalars
from plancache.testing import GiB
from tests.vllm.support import booted


@pytest.fixture
def to_stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``PLANCACHE_EVENTS=1`` in this process, its handler removed after."""
    monkeypatch.setenv("PLANCACHE_EVENTS", "1")
    before = list(events.log.handlers)
    events._to_stderr.cache_clear()
    yield
    events.log.handlers[:] = before
    events._to_stderr.cache_clear()


def test_a_provisional_hit_is_counted_by_the_boot_benchmark(
    gpu: ModuleType,
    store_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    to_stderr: None,
) -> None:
    """A boot that compiles applies a provisional plan: its log line says "applies
    provisional plan", which the benchmark's regular expression did not match (the hit
    vanished from its decisions); its ``boot`` event is counted."""
    worker = gpu.Worker(free_memory=80 * GiB, profiled_kv=1)
    key = as_scalars(factors.worker_factors(worker))
    cold = Plan.new(
        key, kv_cache_memory_bytes=30 * GiB, free_memory_baseline=70 * GiB, provisional=True
    )
    open_store(str(store_dir)).put(cold)
    monkeypatch.setattr(apply, "boot_compiles", lambda worker: True)
    with caplog.at_level(logging.INFO, logger="plancache"):
        assert booted(worker) == 30 * GiB
    assert "applies provisional plan" in caplog.text
    err = capfd.readouterr().err
    assert decisions(err) == ["hit:provisional"]
    [boot] = [e for e in events.read(err) if e["event"] == "boot"]
    assert boot == {
        "event": "boot",
        "kind": "plans",
        "reason": "hit",
        "rank": 0,
        "applied": True,
        "provisional": True,
        "fingerprint": cold.fingerprint,
    }
    [lookup] = [e for e in events.read(err) if e["event"] == "decision"]
    assert (lookup["kind"], lookup["reason"]) == ("plans", "hit")


def test_each_boot_reason_is_an_event(
    gpu: ModuleType, store_dir: Path, capfd: pytest.CaptureFixture[str], to_stderr: None
) -> None:
    """A miss profiles, the next boot applies, an explicit value is neither: one ``boot``
    event each, in the words of ``Reason``."""
    booted(gpu.Worker(free_memory=80 * GiB, profiled_kv=30 * GiB))
    booted(gpu.Worker(free_memory=80 * GiB))
    booted(gpu.Worker(free_memory=80 * GiB, kv_cache_memory_bytes=5 * GiB))
    assert decisions(capfd.readouterr().err) == ["miss", "hit", "explicit"]
