"""plancache's metrics on the registry vLLM serves at ``/metrics``: fresh processes of the
real ``Worker`` path (a miss that profiles and saves, then a hit) and of the compile path (a
cold node that compiles and uploads, then a new node that installs the artifact and makes
vLLM's own metrics) write to one ``PROMETHEUS_MULTIPROC_DIR``, and vLLM's
``get_prometheus_registry`` scrapes it: plancache's figures beside vLLM's, equal to what
the boots did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings
from plancache.testing.servers import closed_port
from tests.vllm import support
from tests.vllm.support import MODEL_CONFIG, REAL_WORKER, REPO, boot_env, vllm_installed
from tests.vllm.test_compile_share import AOT, reports

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _worker(model_dir: Path, store: Path, metrics: Path) -> dict[str, object]:
    """One boot of the real Worker in a fresh process (not forked from a process that
    imported prometheus_client before ``PROMETHEUS_MULTIPROC_DIR`` was set)."""
    env = boot_env(PLANCACHE_URL=str(store), PROMETHEUS_MULTIPROC_DIR=str(metrics))
    port = str(closed_port())
    command = [sys.executable, str(REAL_WORKER), "--model-dir", str(model_dir), "--port", port]
    proc = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    [(code, report, log)] = list(support.outcomes(proc, timeout=300))
    assert code == 0, log[-3000:]
    return report


def _scrape(directory: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Samples]:
    """What vLLM's API server would serve: its registry, in multiprocess mode."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    text = generate_latest(get_prometheus_registry()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def test_plancache_metrics_beside_vllms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    plans = tmp_path / "plans"
    miss = _worker(model_dir, plans, metrics)
    hit = _worker(model_dir, plans, metrics)
    assert (miss["reason"], hit["reason"]) == ("miss", "hit")

    store = tmp_path / "artifacts"
    from tests.vllm.test_compile_share import node

    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    [(cold, _)] = reports(
        node(model_dir, tmp_path / "cold", str(store), "--wait-upload", "60", **env)
    )
    assert cold["aot_saved"] == 1
    [(new, log)] = reports(node(model_dir, tmp_path / "new", str(store), "--vllm-metrics", **env))
    assert new["loaded_from_disk"], log[-3000:]
    key = next((tmp_path / "cold" / AOT).iterdir()).name
    stored = ArtifactStore(Settings(str(store)), CompileSettings()).stored_manifest(key, "rank_0_0")
    assert stored is not None

    text, m = _scrape(metrics, monkeypatch)
    assert "vllm:" in text  # vLLM's own metrics, in the same scrape

    def value(name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in m.items() if n == name and set(labels.items()) <= set(ls))

    assert value("plancache_decisions_total", kind="plans", result="miss") == 1
    assert value("plancache_decisions_total", kind="plans", result="hit") == 1
    assert value("plancache_writes_total", kind="plans", result="created") == 1
    assert value("plancache_decisions_total", kind="compile_artifact", result="miss") == 1
    assert value("plancache_decisions_total", kind="compile_artifact", result="hit") == 1
    assert value("plancache_writes_total", kind="compile_artifact", result="created") == 1
    size = stored.total_size
    assert value("plancache_bytes_total", kind="compile_artifact", direction="uploaded") == size
    assert value("plancache_bytes_total", kind="compile_artifact", direction="fetched") == size
    saved = value("plancache_seconds_saved_total", kind="compile_artifact")
    assert 0 < saved < float(stored.producer["compile_s"])
    assert value("plancache_decisions_total", kind="model_info", result="hit") == 1
