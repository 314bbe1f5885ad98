"""``plancache explain``: a miss named by the factors that differ (issue 34, item 4), in text
and ``--json``, through the real command."""

from __future__ import annotations

import json
from pathlib import Path

from plancache import Plan, open_store
from plancache._defaults import EXPLAIN_DIR
from plancache._plan import MODEL_LABEL
from plancache.integrations.vllm.factors import MAX_EXPLAINED, keep_for_explain
from plancache.testing import FACTORS, GiB
from tests.cli.helpers import failure, ok

NODE = {**FACTORS, "gpu_memory_utilization": 0.85}


def _store(root: Path) -> tuple[Plan, Plan]:
    """A plan that differs from ``NODE`` in ``gpu_memory_utilization`` alone, and one of
    another model that differs in more."""
    store = open_store(str(root))
    near = Plan.new(
        {**FACTORS, "gpu_memory_utilization": 0.9},
        kv_cache_memory_bytes=10 * GiB,
        free_memory_baseline=70 * GiB,
        labels={MODEL_LABEL: "m"},
    )
    far = Plan.new(
        {**FACTORS, "gpu_memory_utilization": 0.9, "world_size": 8, "extra": "x"},
        kv_cache_memory_bytes=10 * GiB,
        free_memory_baseline=70 * GiB,
        labels={MODEL_LABEL: "other"},
    )
    store.put(near)
    store.put(far)
    return near, far


def test_explain_names_the_one_factor_that_differs(tmp_path: Path) -> None:
    near, far = _store(tmp_path / "store")
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"factors": NODE, "labels": {MODEL_LABEL: "m"}}))
    text = ok("explain", str(tmp_path / "store"), "--factors", str(node))
    assert "no plan under this key" in text or "(a miss)" in text, text
    lines = text.splitlines()
    assert f"{near.fingerprint[:12]}  model m: 1 factors differ" in lines, text
    assert "  gpu_memory_utilization: stored 0.9, this node 0.85" in lines, text
    assert far.fingerprint[:12] not in text  # the node's model has a plan: others not listed
    out = json.loads(ok("explain", str(tmp_path / "store"), "--factors", str(node), "--json"))
    assert out["stored"] is False and out["plans"] == 2
    assert out["nearest"] == [
        {
            "fingerprint": near.fingerprint,
            "model": "m",
            "differs": [{"factor": "gpu_memory_utilization", "stored": 0.9, "given": 0.85}],
        }
    ]


def test_without_a_model_every_plan_is_ranked_and_a_hit_is_said(tmp_path: Path) -> None:
    near, far = _store(tmp_path / "store")
    out = json.loads(
        ok("explain", str(tmp_path / "store"), "--factors", "-", "--json", stdin=json.dumps(NODE))
    )
    assert [n["fingerprint"] for n in out["nearest"]] == [near.fingerprint, far.fingerprint]
    assert out["nearest"][1]["differs"] == [
        {"factor": "extra", "stored": "x"},
        {"factor": "gpu_memory_utilization", "stored": 0.9, "given": 0.85},
        {"factor": "world_size", "stored": 8},
    ]
    hit = ok(
        "explain", str(tmp_path / "store"), "--factors", "-", stdin=json.dumps(dict(near.factors))
    )
    assert "a plan is stored under this key (a hit)" in hit
    assert "0 factors differ" in hit


def test_bad_input_is_one_error_line(tmp_path: Path) -> None:
    _store(tmp_path / "store")
    for stdin, why in (("[1]", "expected a JSON object"), ("{", "not valid JSON")):
        err = failure("explain", str(tmp_path / "store"), "--factors", "-", stdin=stdin)
        assert why in err
    assert "1 or more" in failure(
        "explain", str(tmp_path / "store"), "--factors", "-", "--limit", "0", stdin="{}"
    )


def test_the_file_the_plugin_keeps_on_a_miss_explains_it(tmp_path: Path) -> None:
    """``keep_for_explain`` (the vLLM plugin, on a miss) writes what ``explain`` reads, in a
    directory of this user's only, keeping the newest ``MAX_EXPLAINED``."""
    near, _ = _store(tmp_path / "store")
    node_fp = "f" * 64
    path = keep_for_explain(tmp_path / "local", node_fp, NODE, {MODEL_LABEL: "m"})
    assert path == tmp_path / "local" / EXPLAIN_DIR / f"{node_fp}.json"
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    out = json.loads(ok("explain", str(tmp_path / "store"), "--factors", str(path), "--json"))
    assert [n["fingerprint"] for n in out["nearest"]] == [near.fingerprint]
    for i in range(MAX_EXPLAINED + 3):
        keep_for_explain(tmp_path / "local", f"{i:064x}", NODE, {})
    kept = list(path.parent.iterdir())
    assert len(kept) == MAX_EXPLAINED and all(p.suffix == ".json" for p in kept)
