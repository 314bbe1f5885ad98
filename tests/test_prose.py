"""What the docs and docstrings claim about the code, held against it: the pages the index
lists, the commands it names, the public modules, the log line of a plan
hit, what depends on clocks, the cache kinds the plugin shares."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import plancache
from plancache import Plan, PlanCache, open_store
from plancache._artifacts.manifest import CACHE_KINDS
from plancache._command.cli import build_parser
from plancache._defaults import BOUNDS
from plancache.caches import CacheShare, directory_cache

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GiB = 1 << 30


def test_the_index_lists_every_page_and_every_command() -> None:
    index = (DOCS / "index.md").read_text()
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert {p for p in pages if f"({p})" not in index} == set()
    (commands,) = (a for a in build_parser()._actions if a.dest == "command")
    assert isinstance(commands.choices, dict)
    named = {c for c in commands.choices if f"`{c}`" in index or f"`plancache {c}`" in index}
    assert set(commands.choices) - named == set()


def test_the_package_docstring_names_every_public_module() -> None:
    first = (DOCS / "layout.md").read_text().split("\n\n")[1]
    public = set(re.findall(r"`(plancache\.[a-z.]+)`", first))
    assert {"plancache.caches", "plancache.integrations.triton"} <= public
    assert {m for m in public if f"``{m}``" not in (plancache.__doc__ or "")} == set()


def test_the_vllm_pages_hit_line_is_the_line_a_hit_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (shown,) = re.findall(r"`(plancache: lookup hit [^`]*)`", (DOCS / "vllm.md").read_text())
    factors = {"model": "m"}
    store = open_store(str(tmp_path))
    store.put(Plan.new(factors, kv_cache_memory_bytes=50 * GiB, free_memory_baseline=70 * GiB))
    with caplog.at_level(logging.INFO, logger="plancache"):
        d = PlanCache(store).lookup(factors, current_free_memory=79 * GiB)
    assert d.reason == "hit"
    (logged,) = [r.getMessage() for r in caplog.records if "lookup hit" in r.getMessage()]
    shape = re.escape(re.sub(r"[0-9a-f]{12}|[0-9]+(?:\.[0-9]+)?", "#", shown))
    assert re.fullmatch(shape.replace("\\#", "#").replace("#", r"[0-9a-f.]+"), logged), logged


def test_the_reliability_page_names_what_depends_on_clocks() -> None:
    clocks = (DOCS / "reliability.md").read_text().split("**Clocks.**", 1)[1].split("\n- ")[0]
    assert "nothing else depends" not in clocks
    dated = {b.name for b in BOUNDS if "SKEW" in b.name} | {"VERDICT_TTL_S", "MAX_AGE_S"}
    assert {name for name in dated if f"`{name}`" not in clocks} == set()


def test_cache_kinds_are_the_kinds_the_plugin_shares() -> None:
    """``CACHE_KINDS`` names what ``plancache.integrations.vllm.caches`` lists, and not
    DeepGEMM's cache, which docs/compile.md leaves out."""
    text = (ROOT / "plancache/integrations/vllm/caches.py").read_text()
    listed = set(re.findall(r"^- ``([a-z_]+)``:", text, re.M))
    assert set(CACHE_KINDS) == listed
    assert "deep_gemm" not in CACHE_KINDS


def test_a_cache_pull_into_a_root_it_cannot_make_says_so_and_raises_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("")
    env = {"PLANCACHE_URL": str(tmp_path / "store"), "VLLM_CACHE_ROOT": str(tmp_path / "v")}
    with CacheShare.from_env(env) as share:
        fetched = share.pull(directory_cache("kernels", tmp_path / "file" / "root", {"v": 1}))
    assert fetched.reason == "error"
