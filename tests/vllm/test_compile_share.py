"""Compile artifacts shared on the REAL vLLM 0.33.0 compile path on CPU (``tox -e vllm``).

Each node is a fresh process running ``compile_node.py`` (a tiny ``support_torch_compile``
model, real ``VllmConfig``, real plugin discovery, real AOT compile, save and load) with its
own empty ``VLLM_CACHE_ROOT``. Cold compiles are few: one module fixture compiles once and
uploads; the other nodes load its artifact from a local directory, S3 (moto) or GCS
(fake-gcs-server); only the crash and refusal scenarios compile again (side by side). The
format, trust and extraction rules are tested without vLLM in ``tests/artifacts``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from plancache import open_store
from plancache._artifacts.archive import installed_manifest
from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.manifest import parse_artifact_object_name
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings
from plancache._inventory.artifacts import names as artifact_names
from plancache._signing import Keyring
from plancache.testing import child_env
from plancache.testing.servers import FakeGCS, MotoS3
from tests.vllm import support
from tests.vllm.support import HERE, MODEL_CONFIG, REPO, vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
    pytest.mark.timeout(900),  # the module fixtures' compile and nodes count to the first test
]
NODE = HERE / "compile_node.py"
NODE_TIMEOUT_S = 400.0
KEY1 = "k1-" + "c" * 30
AOT = Path("torch_compile_cache") / "torch_aot_compile"
Report = dict[str, Any]


@dataclass
class Cold:
    model_dir: Path
    store: Path
    root: Path
    """The cold node's ``VLLM_CACHE_ROOT``."""
    key: str
    report: Report


def node(
    model_dir: Path, cache_root: Path, url: str, *args: str, **env: str
) -> subprocess.Popen[str]:
    """Start one node on store ``url`` with its own ``VLLM_CACHE_ROOT``."""
    child = child_env(
        [REPO],
        PLANCACHE_URL=url,
        VLLM_CACHE_ROOT=str(cache_root),
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        **env,
    )
    return subprocess.Popen(
        [sys.executable, str(NODE), "--model-dir", str(model_dir), *args],
        env=child,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcomes(*procs: subprocess.Popen[str]) -> Iterator[tuple[int, Report, str]]:
    return support.outcomes(*procs, timeout=NODE_TIMEOUT_S)


def reports(*procs: subprocess.Popen[str]) -> list[tuple[Report, str]]:
    out = []
    for returncode, report, log in outcomes(*procs):
        assert returncode == 0, log[-4000:]
        out.append((report, log))
    return out


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Cold:
    """The one cold compile: a node on an empty local store compiles, saves and uploads."""
    base = tmp_path_factory.mktemp("compile")
    model_dir = base / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    store, root = base / "store", base / "cold"
    [(report, log)] = reports(node(model_dir, root, str(store), "--wait-upload", "120"))
    assert report["aot_compiles"] == 1 and report["aot_saved"] == 1, log[-3000:]
    assert not report["loaded_from_disk"] and report["equal_eager"]
    names = artifact_names(open_store(str(store)).layer)
    assert len(names) == 1, log[-3000:]
    parsed = parse_artifact_object_name(names[0])
    assert parsed is not None and parsed[1] == "rank_0_0"
    assert "stored: store=created" in log
    assert report["inspections"] == 1, log[-3000:]  # no model info anywhere: vLLM inspects
    infos = list(open_store(str(store)).layer.list_objects("model_info_"))
    assert len(infos) == 1, log[-3000:]  # and its file is shared
    return Cold(model_dir, store, root, parsed[0], report)


def _upload(cold: Cold, url: str, options: dict[str, Any], keyring: Keyring) -> None:
    settings = Settings(url, storage_options=options, keyring=keyring)
    artifacts = ArtifactStore(settings, CompileSettings())
    assert artifacts.upload(cold.root / AOT / cold.key, cold.key, "rank_0_0") == {"store": True}


@dataclass
class Fleet:
    """Four new nodes started side by side, each with an empty ``VLLM_CACHE_ROOT``."""

    loads: list[tuple[Report, str]]
    """From the local directory, from S3 with a signature required (read-only), from GCS
    unsigned with the opt-in."""
    crash: tuple[int, Report, str]
    """SIGKILLed right after vLLM loaded the artifact installed from ``crash_store``."""
    crash_root: Path
    crash_store: Path


@pytest.fixture(scope="module")
def fleet(
    cold: Cold,
    tmp_path_factory: pytest.TempPathFactory,
    moto_s3: MotoS3,
    fake_gcs: FakeGCS,
) -> Fleet:
    base = tmp_path_factory.mktemp("fleet")
    s3_bucket, gcs_bucket = "compile-fleet", "compile-fleet"
    moto_s3.create_bucket(s3_bucket)
    fake_gcs.create_bucket(gcs_bucket)
    s3_opts: dict[str, Any] = {
        "endpoint_url": moto_s3.endpoint,
        "key": "k",
        "secret": "s",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    gcs_opts = {"endpoint_url": fake_gcs.endpoint, "token": "anon"}
    _upload(cold, f"s3://{s3_bucket}", s3_opts, Keyring(KEY1))
    _upload(cold, f"gs://{gcs_bucket}", gcs_opts, Keyring())
    crash_store = base / "crash-store"
    shutil.copytree(cold.store, crash_store)
    procs = [
        node(cold.model_dir, base / "local", str(cold.store)),
        node(
            cold.model_dir,
            base / "s3",
            f"s3://{s3_bucket}",
            PLANCACHE_STORAGE_OPTIONS=json.dumps(s3_opts),
            PLANCACHE_VERIFY_KEYS=KEY1,
            PLANCACHE_READ_ONLY="1",
        ),
        node(
            cold.model_dir,
            base / "gcs",
            f"gs://{gcs_bucket}",
            PLANCACHE_STORAGE_OPTIONS=json.dumps(gcs_opts),
            PLANCACHE_COMPILE_TRUST_UNSIGNED="1",
        ),
        node(cold.model_dir, base / "crash", str(crash_store), "--die-after-load"),
    ]
    done = list(outcomes(*procs))
    for code, _, log in done[:3]:
        assert code == 0, log[-4000:]
    return Fleet([(r, log) for _, r, log in done[:3]], done[3], base / "crash", crash_store)


def test_on_unknown_internals_one_warning_and_vllm_compiles_as_without_plancache(
    cold: Cold, tmp_path: Path
) -> None:
    """A vLLM whose AOT loader takes other parameters: the plugin names it in one warning,
    wraps nothing, and vLLM compiles as without plancache although the store holds the
    artifact."""
    [(report, log)] = reports(
        node(cold.model_dir, tmp_path / "root", str(cold.store), "--other-loader")
    )
    ours = [line for line in log.splitlines() if "plancache:" in line]
    warnings = [line for line in ours if "WARNING" in line or "not shared" in line]
    assert len(warnings) == 1, warnings
    assert "_try_load_aot_compiled_fn takes (model, path, strict)" in warnings[0]
    assert "compile artifacts not shared" in warnings[0]
    assert report["aot_compiles"] == 1 and not report["loaded_from_disk"], log[-3000:]
    assert report["equal_eager"]
    assert "compile artifact" not in log.replace(warnings[0], "")  # no fetch, no upload


def test_new_nodes_load_instead_of_compiling(cold: Cold, fleet: Fleet) -> None:
    """Each new node loads the artifact (vLLM's own counters), compiles nothing, and
    computes what eager does: from a local directory, from S3 with a signature required
    (read-only), from GCS unsigned with the opt-in."""
    for report, log in fleet.loads:
        assert report["loaded_from_disk"] and report["aot_loaded"] == 1, log[-3000:]
        assert report["aot_compiles"] == 0 and report["equal_eager"]
        assert "rank_0_0: hit from store" in log
        assert "while the model loaded" in log  # fetched from the model's construction on
    local, _, _ = fleet.loads  # the one store that holds the cold node's model info
    assert local[0]["inspections"] == 0, local[1][-3000:]  # vLLM read the shared file
    assert "ForCausalLM: hit from store" in local[1]
    assert (
        len(artifact_names(open_store(str(cold.store)).layer)) == 1
    )  # nothing uploaded after a load


def test_crash_after_install_costs_one_boot_and_refusals_are_logged(
    cold: Cold, fleet: Fleet, tmp_path: Path
) -> None:
    """A node SIGKILLed right after vLLM loaded the installed artifact: the next boot on that
    node avoids it (removes its copy, retracts it from the store) and compiles. Beside it, a
    node given an artifact vLLM cannot load (its ``model`` replaced, validly listed) logs
    vLLM's refusal and compiles."""
    code, report, log = fleet.crash
    assert code == -9 and report["dying"], log[-3000:]
    installed = installed_manifest(fleet.crash_root / AOT / cold.key / "rank_0_0")
    assert installed is not None  # what the dead boot installed is still there
    bad_store = tmp_path / "bad-store"
    bad_tree = tmp_path / "bad-tree" / cold.key
    shutil.copytree(cold.root / AOT / cold.key, bad_tree)
    (bad_tree / "rank_0_0" / "model").write_bytes(b"not a compiled function")
    ArtifactStore(Settings(str(bad_store)), CompileSettings()).upload(
        bad_tree, cold.key, "rank_0_0"
    )

    (after, after_log), (bad, bad_log) = reports(
        node(cold.model_dir, fleet.crash_root, str(fleet.crash_store), "--wait-upload", "120"),
        node(cold.model_dir, tmp_path / "bad", str(bad_store)),
    )
    assert "gate:crashed-before" in after_log
    assert after["aot_compiles"] == 1 and not after["loaded_from_disk"], after_log[-3000:]
    assert after["equal_eager"]
    stored = ArtifactStore(Settings(str(fleet.crash_store)), CompileSettings()).fetch(
        tmp_path / "check" / cold.key, cold.key, "rank_0_0"
    )
    assert stored.manifest is not None and stored.manifest.digest != installed.digest

    assert "vLLM refused the installed compile artifact" in bad_log, bad_log[-3000:]
    assert bad["aot_compiles"] == 1 and bad["equal_eager"]
