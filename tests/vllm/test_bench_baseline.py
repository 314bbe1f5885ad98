"""The local-store benchmark's baseline is vLLM's own read: ``benchmarks.local_costs``
``vllm_load_plan`` answers as vLLM's ``_load_plan`` does, file for file."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.local_costs import vllm_load_plan
from plancache._backends.local import LocalStore
from plancache._keys import plan_object_name
from plancache._plan import SCHEMA
from plancache._store import PlanStore
from plancache.testing import make_plan
from tests.helpers import local_layer
from tests.vllm.support import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
]


def test_the_benchmark_reads_plans_as_vllm_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.worker import startup_plan

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    store = PlanStore(LocalStore(tmp_path / "startup_plan"))
    plan = make_plan()
    store.put(plan)
    fp, builtin = plan.fingerprint, startup_plan.PLAN_SCHEMA_VERSION
    assert vllm_load_plan(fp, builtin) is None is startup_plan._load_plan(fp)  # schema differs
    monkeypatch.setattr(startup_plan, "PLAN_SCHEMA_VERSION", SCHEMA)
    read = vllm_load_plan(fp, SCHEMA)
    assert read is not None and read == startup_plan._load_plan(fp)
    assert read["fingerprint"] == fp
    other = make_plan(kv=1 << 30, baseline=2 << 30, factors={"other": 1})
    assert vllm_load_plan(other.fingerprint, SCHEMA) is None  # absent
    assert startup_plan._load_plan(other.fingerprint) is None
    (local_layer(store).root / plan_object_name(other.fingerprint)).write_text("{not json")
    assert vllm_load_plan(other.fingerprint, SCHEMA) is None  # unreadable
    assert startup_plan._load_plan(other.fingerprint) is None
    monkeypatch.delenv("VLLM_CACHE_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default root too
    xdg = PlanStore(LocalStore(tmp_path / "xdg" / "vllm" / "startup_plan"))
    xdg.put(plan)
    assert vllm_load_plan(fp, SCHEMA) == startup_plan._load_plan(fp) is not None
