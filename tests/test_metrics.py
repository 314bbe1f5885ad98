"""plancache's Prometheus metrics, as a scrape of a multiprocess directory sees them: a
fresh process makes the decisions (plans, a compile artifact, the S3 store's calls), and
the scrape here reads what it wrote, as vLLM's API server reads its workers'."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from plancache.testing import child_env

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from plancache import PlanCache, open_store
    from plancache._artifacts.engine import CompileSettings
    from plancache._artifacts.store import ArtifactStore
    from plancache._config import Settings
    from plancache.testing import FACTORS, GiB, servers
    from tests.artifacts.helpers import KEY, RANK, make_tree

    work = Path(sys.argv[1])
    cache = PlanCache(open_store(str(work / "plans")))
    cache.lookup({**FACTORS, "model": "m1"}, current_free_memory=50 * GiB)  # miss
    cache.record({**FACTORS, "model": "m1"}, kv_cache_memory_bytes=4 * GiB,
                 free_memory_baseline=40 * GiB)
    cache.lookup({**FACTORS, "model": "m1"}, current_free_memory=50 * GiB)  # hit
    artifacts = ArtifactStore(Settings(str(work / "artifacts")), CompileSettings())
    root = make_tree(work / "src" / KEY, model=b"M" * 100_000)
    artifacts.upload(root, KEY, RANK, labels={"model": "m1"}, producer={"compile_s": 30.0})
    fetched = artifacts.fetch(work / "node" / KEY, KEY, RANK)
    assert fetched.reason == "hit", fetched
    print(fetched.seconds, fetched.manifest.total_size)
    with servers.s3_server() as (url, options):
        open_store(url, **options).get("0" * 64)
    """
)


def _scrape(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_shows_what_the_process_decided(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = child_env(PROMETHEUS_MULTIPROC_DIR=str(directory))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    fetch_s, size = float(out.stdout.split()[-2]), int(out.stdout.split()[-1])
    m = _scrape(directory)

    def value(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    plans = {"kind": "plans", "model": "m1"}
    assert value("plancache_decisions_total", result="miss", **plans) == 1
    assert value("plancache_decisions_total", result="hit", **plans) == 1
    assert value("plancache_writes_total", kind="plans", result="created") == 1
    artifact = {"kind": "compile_artifact", "model": "m1"}
    assert value("plancache_decisions_total", result="hit", **artifact) == 1
    assert value("plancache_writes_total", kind="compile_artifact", result="created") == 1
    assert value("plancache_bytes_total", kind="compile_artifact", direction="fetched") == size
    assert value("plancache_bytes_total", kind="compile_artifact", direction="uploaded") == size
    saved = value("plancache_seconds_saved_total", **artifact)
    assert saved == pytest.approx(30.0 - fetch_s, abs=0.05)  # the compile's 30 s, less the fetch
    assert value("plancache_store_request_seconds_count", scheme="s3", op="read") >= 1
    hist = value("plancache_decision_seconds_count", kind="plans", result="hit")
    assert hist == 1


def test_metrics_off_write_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = child_env(PROMETHEUS_MULTIPROC_DIR=str(directory), PLANCACHE_METRICS="0")
    code = (
        "from plancache import PlanCache, open_store\n"
        "from plancache.testing import FACTORS, GiB\n"
        f"PlanCache(open_store({str(tmp_path / 'plans')!r})).lookup(FACTORS, 50 * GiB)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=True)
    assert not [k for k in _scrape(directory) if k[0].startswith("plancache_")]
