"""Capabilities, not concrete types (issue 43, item 2): a backend registered from outside the
package declares what it is and needs (``ObjectLayer.probe_store``, ``endpoint``, ...) and
gets what the built-in object stores get: the conformance guard on the one open path (a
dishonest one is refused every write) and every store check of ``plancache doctor``, run
here as a command in a process of its own that finds the backend through the
``plancache.backends`` entry points."""

from __future__ import annotations

import io
import itertools
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plancache import CREATE, ObjectLayer, Opened, PlanStore, Update, register_backend
from plancache._backends import open_layer
from plancache._backends.guarded import GuardedStore
from plancache._backends.lazy import LazyStore
from plancache._backends.tiered import ReadOnlyLayer
from plancache._config import Settings
from plancache._forwarding import beneath
from plancache._objects import WriteMode
from plancache.errors import PlanStoreError, StoreIgnoresPreconditionsError
from plancache.testing import LocalLayer, child_env, make_plan
from tests.cli.helpers import run

_OBJECTS: dict[tuple[str, str], tuple[bytes, int]] = {}
"""(scope, name) -> (bytes, version): every ``DictLayer``'s objects, in this process."""
_LOCK = threading.Lock()
_VERSIONS = itertools.count(1)


class DictLayer(ObjectLayer):
    """``<scheme>://anything``: objects in this process's memory, conditional writes honoured;
    declares a probe store (``<url>/.probe``), as an object store behind HTTP would."""

    honest = True

    def __init__(self, url: str, scope: str | None = None, **storage_options: Any) -> None:
        self._url = url
        self.scope = url if scope is None else scope

    @property
    def url(self) -> str:
        return self._url

    def _get(self, name: str) -> tuple[bytes, int] | None:
        with _LOCK:
            return _OBJECTS.get((self.scope, name))

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        found = self._get(name)
        return None if found is None else (found[0][:limit], found[1])

    def open_object(self, name: str) -> Opened | None:
        found = self._get(name)
        return None if found is None else Opened(io.BytesIO(found[0]), found[1])

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        data = b"".join(chunks)
        with _LOCK:
            current = _OBJECTS.get((self.scope, name))
            if self.honest:
                if isinstance(mode, Update) and (current is None or current[1] != mode.version):
                    return False
                if not isinstance(mode, Update) and current is not None:
                    return False
            _OBJECTS[(self.scope, name)] = (data, next(_VERSIONS))
            return True

    def delete_object(self, name: str, version: object | None = None) -> bool:
        with _LOCK:
            current = _OBJECTS.get((self.scope, name))
            if current is None or version not in (None, current[1]):
                return False
            del _OBJECTS[(self.scope, name)]
            return True

    def list_objects(self, prefix: str) -> Iterator[str]:
        with _LOCK:
            names = [n for s, n in _OBJECTS if s == self.scope and n.startswith(prefix)]
        return iter(names)

    def probe_store(self) -> ObjectLayer | None:
        return type(self)(self._url, f"{self.scope}/.probe")


class LyingLayer(DictLayer):
    """A ``DictLayer`` that ignores every write precondition (overwrites, answers True)."""

    honest = False


class PlainLayer(DictLayer):
    """A ``DictLayer`` that declares nothing: no probe store, as before capabilities."""

    def probe_store(self) -> ObjectLayer | None:
        return None


class WrongLayer(DictLayer):
    """Declares capabilities with answers of the wrong type."""

    def endpoint(self) -> str | None:
        return 42  # type: ignore[return-value]

    def local_directory(self) -> Path | None:
        return "/tmp"  # type: ignore[return-value]


BACKENDS = {
    "honestdict": DictLayer,
    "liardict": LyingLayer,
    "plaindict": PlainLayer,
    "wrongdict": WrongLayer,
}


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    for scheme, layer in BACKENDS.items():
        register_backend(scheme, f"{__name__}:{layer.__qualname__}")


def _stored(url: str) -> list[str]:
    with _LOCK:
        return sorted(n for s, n in _OBJECTS if s == url)


@pytest.fixture(autouse=True)
def _own_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Verdicts cached under this test's directory (without a local tier, ``local_dir`` is
    the default directory of the process's environment)."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))


def _open(url: str, tmp_path: Path) -> PlanStore:
    """The plans kind on ``url`` through the one open path, no local tier."""
    env = {"PLANCACHE_URL": url, "PLANCACHE_LOCAL_TIER": "0", "VLLM_CACHE_ROOT": str(tmp_path)}
    return Settings.from_env(env).open_store()


def test_a_registered_backend_that_declares_a_probe_store_is_guarded(tmp_path: Path) -> None:
    store = _open("honestdict://fleet", tmp_path)
    assert store.put(make_plan()).value == "created"
    assert any(isinstance(layer, GuardedStore) for layer in beneath(store.layer))
    assert len(_stored("honestdict://fleet")) == 1
    assert _stored("honestdict://fleet/.probe") == ["verdict.json"]  # shared with the fleet
    store.close()


def test_a_dishonest_registered_backend_is_refused_every_write(tmp_path: Path) -> None:
    store = _open("liardict://fleet", tmp_path)
    with pytest.raises(StoreIgnoresPreconditionsError, match="ignores write preconditions"):
        store.put(make_plan())
    assert _stored("liardict://fleet") == []  # the probe wrote under its own prefix only
    assert store.layer.known_to_ignore_preconditions()
    store.close()


def test_a_registered_backend_that_declares_nothing_is_not_probed(tmp_path: Path) -> None:
    store = _open("plaindict://fleet", tmp_path)
    assert store.put(make_plan()).value == "created"
    assert not any(isinstance(layer, GuardedStore) for layer in beneath(store.layer))
    assert _stored("plaindict://fleet/.probe") == []
    store.close()


def test_a_registered_backends_capabilities_are_checked() -> None:
    layer = open_layer("wrongdict://x")
    assert layer.credential_source() is None and layer.call_timeout is None
    with pytest.raises(PlanStoreError, match=r"WrongLayer.endpoint gave int"):
        layer.endpoint()
    with pytest.raises(PlanStoreError, match=r"WrongLayer.local_directory gave str"):
        layer.local_directory()
    probed = layer.probe_store()
    assert probed is not None and probed.url == "wrongdict://x"
    assert repr(probed).startswith("CheckedLayer(")  # checked in turn


def test_the_wrappers_forward_the_capabilities(tmp_path: Path) -> None:
    """A lazy opening, a write guard and a read-only view answer what the layer beneath
    declares; a bare local directory declares itself and no probe store."""
    local = LocalLayer(tmp_path)
    assert local.local_directory() == tmp_path
    assert local.probe_store() is None and local.endpoint() is None
    assert ReadOnlyLayer(LazyStore("x", lambda: local)).local_directory() == tmp_path
    guarded = GuardedStore(open_layer("honestdict://w"), None)
    assert guarded.probe_store() is not None and guarded.local_directory() is None
    assert local.remove_stale_temp_files() == 0 and guarded.remove_stale_temp_files() is None


def _doctor(url: str, tmp_path: Path, code: int) -> dict[str, dict[str, str]]:
    """``plancache doctor URL --json`` in a process of its own, which finds the test's backends
    through the ``plancache.backends`` entry points; must exit ``code``; its rows by check."""
    dist = tmp_path / "site" / "dictstores-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dictstores\nVersion: 1.0\n")
    lines = [f"{s} = {__name__}:{layer.__qualname__}" for s, layer in BACKENDS.items()]
    (dist / "entry_points.txt").write_text("[plancache.backends]\n" + "\n".join(lines) + "\n")
    root = Path(__file__).resolve().parent.parent
    env = child_env([tmp_path / "site", root], VLLM_CACHE_ROOT=str(tmp_path / "root"))
    result = run("doctor", url, "--json", env=env)
    assert result.returncode == code, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    return {c["check"]: c for c in report["checks"] if c["section"] in ("store", "probe")}


def test_doctor_checks_a_registered_backend_as_it_checks_s3_and_gcs(tmp_path: Path) -> None:
    rows = _doctor("honestdict://fleet", tmp_path, 0)
    assert rows["open"]["detail"] == "honestdict://fleet (CheckedLayer)"
    assert rows["verdict"]["status"] == "ok" and rows["verdict"]["detail"].startswith("honest")
    for check in ("endpoint", "read", "list", "write", "delete", "cas-wrong-version"):
        assert rows[check]["status"] == "ok", rows[check]
    assert rows["endpoint"]["detail"] == "none declared"
    assert rows["credentials"]["detail"] == "not declared by the store"
    assert "clock" not in rows  # no endpoint to ask the time


def test_doctor_finds_a_dishonest_registered_backend(tmp_path: Path) -> None:
    rows = _doctor("liardict://fleet", tmp_path, 1)
    assert rows["verdict"]["status"] == "finding"
    assert rows["verdict"]["detail"].startswith("lies")
    assert rows["create-existing"]["status"] == "finding"
