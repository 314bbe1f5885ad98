"""The one table of settings and bounds (``plancache._defaults``): every bound and every
setting is declared there once, read from there, and the docs' tables are generated from it;
the local directory and the time budget."""

from __future__ import annotations

import copy
import inspect
import pickle
import re
import shutil
from pathlib import Path

import pytest

from benchmarks.figures import RESULTS, load, stale
from plancache import PlanCache, _defaults, open_store
from plancache._config import Settings
from plancache._defaults import BOUNDS, DEFAULT_BUDGET_S, SETTINGS, default_dir, tables

ROOT = Path(__file__).resolve().parent.parent
TIME_CONSTANT = re.compile(r"^(_?[A-Z][A-Z0-9_]*_(?:S|SECONDS))\s*(?::[^=\n]+)?=", re.M)
"""A module-level constant named as a time bound (``*_S``, ``*_SECONDS``) being defined."""
RAW_READ = re.compile(r"""(?:\.get\(|environ\[)\s*["']PLANCACHE_""")
"""A ``PLANCACHE_*`` variable read as raw text, not through its ``Setting``."""


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


def test_every_bound_is_the_constant_of_its_name() -> None:
    names = [b.name for b in BOUNDS]
    assert len(names) == len(set(names)) >= 30
    assert all(getattr(_defaults, b.name) == b.value for b in BOUNDS)
    shown = re.findall(r"^\| `(\w+)` \| (\S+) ", tables()["bounds"], re.M)
    assert [(name, float(value)) for name, value in shown] == [(b.name, b.value) for b in BOUNDS]


def test_no_time_bound_is_defined_outside_the_table() -> None:
    assert TIME_CONSTANT.findall("RETRY_S = 60.0\n_POLL_S: float = 0.05\n") == [
        "RETRY_S",
        "_POLL_S",
    ]  # the pattern finds a planted one
    found = {
        str(path.relative_to(ROOT)): TIME_CONSTANT.findall(path.read_text())
        for path in (ROOT / "plancache").rglob("*.py")
        if path.name != "_defaults.py"
    }
    assert not {where: names for where, names in found.items() if names}


def test_every_setting_is_read_through_the_table() -> None:
    assert RAW_READ.search('env.get("PLANCACHE_TIMEOUT", "2")')  # a planted raw read
    raw = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "plancache").rglob("*.py")
        if "testing" not in path.parts and RAW_READ.search(path.read_text())
    ]
    assert not raw, f"read PLANCACHE_* through plancache._defaults' Setting.read: {raw}"
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))


def test_a_setting_reads_its_default_when_unset_and_parses_when_set() -> None:
    timeout = _defaults.TIMEOUT
    assert timeout.read({}) == DEFAULT_BUDGET_S
    assert timeout.read({"PLANCACHE_TIMEOUT": "7"}) == 7.0
    with pytest.raises(ValueError, match="PLANCACHE_TIMEOUT"):
        timeout.read({"PLANCACHE_TIMEOUT": "soon"})
    assert _defaults.ENABLE.read({"PLANCACHE_ENABLE": " "}) is None  # blank: not set
    options = _defaults.STORAGE_OPTIONS
    assert options.read({}) == {} and options.read({}) is not options.read({})


def test_settings_from_the_environment_copy_and_pickle() -> None:
    settings = Settings.from_env({})
    assert copy.deepcopy(settings) == pickle.loads(pickle.dumps(settings)) == settings


def _copy_docs(to: Path) -> None:
    for name in ("README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, to / name)
    shutil.copytree(ROOT / "docs", to / "docs")


def test_the_docs_tables_are_the_tables_generated(tmp_path: Path) -> None:
    """The README's settings table and the configuration page's bounds table are what
    ``tables()`` gives (``python -m benchmarks.figures --write`` writes them); a planted
    difference in either is found."""
    results = load(RESULTS)
    generated = tables()
    readme, config = (ROOT / "README.md").read_text(), (ROOT / "docs/configuration.md").read_text()
    assert f"<!-- figures:settings -->{generated['settings']}<!-- /figures -->" in readme
    assert f"<!-- figures:bounds -->{generated['bounds']}<!-- /figures -->" in config
    _copy_docs(tmp_path)
    assert stale(results, tmp_path) == {}
    for page, row in [
        ("README.md", "| `PLANCACHE_TIMEOUT` | seconds | seconds a lookup or record"),
        ("docs/configuration.md", "| `CLOCK_SKEW_S` | 300 s |"),
    ]:
        planted = tmp_path / f"planted-{page.replace('/', '-')}"
        planted.mkdir()
        _copy_docs(planted)
        text = (planted / page).read_text()
        assert row in text
        (planted / page).write_text(text.replace(row, row.replace("s", "S", 1)))
        assert list(stale(results, planted)) == [planted / page]
