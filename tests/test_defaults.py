"""Defaults every layer shares: the local directory and the time budget."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from plancache import PlanCache, open_store
from plancache._config import Settings
from plancache._defaults import DEFAULT_BUDGET_S, default_dir


def test_default_dir_follows_vllm_cache_root() -> None:
    assert default_dir({"VLLM_CACHE_ROOT": "/x/y"}) == Path("/x/y/startup_plan")
    assert default_dir({"HOME": "/h"}).name == "startup_plan"
    assert open_store(None).url == str(default_dir())
    assert default_dir({"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/vllm/startup_plan")
    assert default_dir({"VLLM_CACHE_ROOT": "", "XDG_CACHE_HOME": "/xdg"}).parent.name == "vllm"


@pytest.mark.default_bounds  # checks the default budget
def test_one_budget_default_everywhere() -> None:
    assert DEFAULT_BUDGET_S == 2.0
    assert inspect.signature(PlanCache).parameters["timeout"].default == DEFAULT_BUDGET_S
    assert Settings.from_env({}).timeout == Settings("x").timeout == DEFAULT_BUDGET_S
