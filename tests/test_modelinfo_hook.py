"""The plugin's model-info hook (``plancache.integrations.vllm.modelinfo``) on a registry
class shaped as vLLM 0.33's ``_LazyRegisteredModel`` (its cache methods as vLLM writes them),
without vLLM: a node's file is shared, a new node reads it instead of inspecting, a vLLM
without those methods is left as it is, and a store that does not answer costs at most the
budget. The real registry is exercised in ``tests/vllm/test_compile_share.py``."""

from __future__ import annotations

import json
import logging
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from plancache._inventory.artifacts import names as artifact_names
from plancache.integrations.vllm import compile, modelinfo, state
from plancache.testing.hostile import SilentServer

HASH = "a" * 64


def registry(cache_root: Path) -> types.ModuleType:
    """A module like ``vllm.model_executor.models.registry``: a lazily registered model
    class whose model info is read from and written to ``cache_root/modelinfos``."""

    @dataclass(frozen=True)
    class _LazyRegisteredModel:
        module_name: str
        class_name: str

        @staticmethod
        def _get_cache_dir() -> Path:
            return cache_root / "modelinfos"

        def _get_cache_filename(self) -> str:
            return f"{self.module_name}-{self.class_name}".replace(".", "-") + ".json"

        def _load_modelinfo_from_cache(self, module_hash: str) -> dict[str, Any] | None:
            try:
                found = json.loads((self._get_cache_dir() / self._get_cache_filename()).read_text())
            except FileNotFoundError:
                return None
            return found["modelinfo"] if found["hash"] == module_hash else None

        def _save_modelinfo_to_cache(self, mi: dict[str, Any], module_hash: str) -> None:
            self._get_cache_dir().mkdir(parents=True, exist_ok=True)
            path = self._get_cache_dir() / self._get_cache_filename()
            path.write_text(json.dumps({"hash": module_hash, "modelinfo": mi}))

    module = types.ModuleType("vllm.model_executor.models.registry")
    module._LazyRegisteredModel = _LazyRegisteredModel  # type: ignore[attr-defined]
    return module


def inspect(module: types.ModuleType) -> tuple[dict[str, Any], bool]:
    """vLLM's ``inspect_model_cls`` in short: the cached info, else an inspection (True)
    whose result is saved."""
    model = module._LazyRegisteredModel("vllm.models.tiny", "TinyForCausalLM")
    found = model._load_modelinfo_from_cache(HASH)
    if found is not None:
        return found, False
    mi = {"is_text_generation_model": True}
    model._save_modelinfo_to_cache(mi, HASH)
    return mi, True


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A fresh plugin state per node, and a ``vllm`` that names its version."""
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0"))
    previous = state.use(state.Plugin())  # a fresh node's plugin state
    yield
    compile.uploads.wait(30)
    state.use(previous)


def _env(monkeypatch: pytest.MonkeyPatch, url: str, **more: str) -> None:
    monkeypatch.setenv("PLANCACHE_URL", url)
    for key, value in more.items():
        monkeypatch.setenv(key, value)


def _silent_store(
    monkeypatch: pytest.MonkeyPatch, silent: SilentServer, cache_root: Path, **more: str
) -> None:
    """S3 at ``silent`` (an endpoint that never answers; 30 s per call), no local tier,
    vLLM's cache at ``cache_root``, uploads given up after 3 s (the fixture waits for them
    at the end of the test), and ``more``."""
    options = {"endpoint_url": silent.endpoint, "key": "k", "secret": "s", "timeout": 30}
    _env(
        monkeypatch,
        "s3://silent/prefix",
        PLANCACHE_STORAGE_OPTIONS=json.dumps(options),
        PLANCACHE_COMPILE_TRUST_UNSIGNED="1",
        PLANCACHE_LOCAL_TIER="0",
        VLLM_CACHE_ROOT=str(cache_root),
        **{"PLANCACHE_COMPILE_TIMEOUT": "3", **more},
    )


@pytest.mark.usefixtures("node")
def test_a_new_node_reads_the_shared_file_instead_of_inspecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    _env(monkeypatch, str(store), VLLM_CACHE_ROOT=str(tmp_path / "a"))
    first = registry(tmp_path / "a")
    assert modelinfo.patch_registry(first) and modelinfo.patch_registry(first)  # once
    assert inspect(first)[1]  # nothing shared yet: inspected
    assert compile.uploads.wait(30)
    assert len(list(compile.opened().store.list_objects("model_info_"))) == 1  # type: ignore[union-attr]
    state.use(state.Plugin())  # the next node
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "b"))
    second = registry(tmp_path / "b")
    modelinfo.patch_registry(second)
    info, inspected = inspect(second)
    assert not inspected and info == {"is_text_generation_model": True}
    assert artifact_names(compile.opened().store) == []  # type: ignore[union-attr]


@pytest.mark.usefixtures("node")
def test_a_vllm_without_the_cache_methods_is_left_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    module = types.ModuleType("vllm.model_executor.models.registry")
    with caplog.at_level(logging.WARNING, logger="plancache"):
        assert not modelinfo.patch_registry(module)
    assert [r.getMessage() for r in caplog.records] == [
        "plancache: vllm.model_executor.models.registry: _LazyRegisteredModel is missing; "
        "model info is not shared"
    ]


@pytest.mark.usefixtures("node")
def test_a_store_that_does_not_answer_costs_at_most_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SilentServer() as silent:
        # the store's own call bound (30 s) far above the 0.5 s budget: only the budget can
        # end the wait in under half of it
        _silent_store(monkeypatch, silent, tmp_path / "c", PLANCACHE_TIMEOUT="0.5")
        module = registry(tmp_path / "c")
        modelinfo.patch_registry(module)
        compile.opened()  # the client opens while the weights load, not on this path
        start = time.monotonic()
        info, inspected = inspect(module)
        assert inspected and info  # vLLM inspects as if plancache were absent
        assert time.monotonic() - start < 30 / 2  # the 0.5 s budget, not the store's bound


@pytest.mark.usefixtures("node")
def test_the_exit_names_the_uploads_it_abandons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An upload still running when ``PLANCACHE_COMPILE_EXIT_WAIT`` ends at exit is named
    by what it carries: here model info, bound for a store that never answers."""
    with SilentServer() as silent:
        _silent_store(
            monkeypatch,
            silent,
            tmp_path / "c",
            PLANCACHE_TIMEOUT="1",  # the lookup's bound; the upload's: 3 s
            PLANCACHE_COMPILE_EXIT_WAIT="0.2",
        )
        module = registry(tmp_path / "c")
        modelinfo.patch_registry(module)
        assert inspect(module)[1]  # the lookup timed out; the upload starts
        with caplog.at_level(logging.WARNING, logger="plancache"):
            compile._at_exit()
    [line] = [
        r.getMessage() for r in caplog.records if "PLANCACHE_COMPILE_EXIT_WAIT" in r.getMessage()
    ]
    assert line.endswith("abandoned, nothing of them stored: model info"), line


@pytest.mark.usefixtures("node")
def test_a_file_installed_that_vllm_does_not_read_is_reported_as_built_anyway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Both ways: a node that reads the installed file reports nothing; one whose reader
    rejects it (another format) inspects, with one WARNING naming the class."""
    store = tmp_path / "store"
    _env(monkeypatch, str(store), VLLM_CACHE_ROOT=str(tmp_path / "a"))
    first = registry(tmp_path / "a")
    modelinfo.patch_registry(first)
    assert inspect(first)[1]
    deadline = time.monotonic() + 30  # its upload (another test's may still hang: not waited)
    while not list(store.glob("model_info_*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    for name, rejects in (("b", False), ("c", True)):
        state.use(state.Plugin())  # the next node
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / name))
        node = registry(tmp_path / name)
        cls = node._LazyRegisteredModel
        if rejects:  # a reader of another format: nothing it finds is read

            def _load_modelinfo_from_cache(self: Any, module_hash: str) -> None:
                return None

            monkeypatch.setattr(cls, "_load_modelinfo_from_cache", _load_modelinfo_from_cache)
        modelinfo.patch_registry(node)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="plancache"):
            assert inspect(node)[1] is rejects
        warned = [
            r.getMessage() for r in caplog.records if "yet vLLM did not read" in r.getMessage()
        ]
        assert warned == (
            [
                "plancache: model info vllm.models.tiny.TinyForCausalLM: installed, yet vLLM "
                "did not read it and inspects the class (its reader or file format differs "
                "from the producer's)"
            ]
            if rejects
            else []
        )
