"""The headline figures of the README and the docs are the committed results file's
(``benchmarks.figures``): every quote between ``<!-- figures:NAME -->`` and
``<!-- /figures -->`` is what that file gives, and a results file as the main job writes it
gives every quote."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks import figures, machine, report
from benchmarks.figures import MARKED, RESULTS, ResultsError, blocks, documents, load, stale

ROOT = Path(__file__).resolve().parent.parent
QUOTING = [
    "README.md",
    "CHANGELOG.md",
    "docs/compile.md",
    "docs/benchmarks.md",
    "docs/configuration.md",
]
"""The pages that quote the main job's compile boots, or the tables of settings and bounds."""


def _main_job_results(tmp_path: Path) -> dict[str, Any]:
    """A results file as ``python -m benchmarks`` writes it (``report.write_json``), with
    the compile stage's figures in the shape ``compile_share.measure`` gives them."""

    def case(process: float, first: float, cold: float = 20.0, warm: float = 10.0) -> Any:
        return {
            "first_forward_s": first,
            "process_s": process,
            "inductor_files": 40,
            "plancache": "hit",
            "fetch_s": 0.05,
            "process_runs_s": [process - 0.2, process, process + 0.3],
            "first_forward_saved_s": cold - first,
            "first_forward_ratio": first / cold,
            "process_saved_s": 40.0 - process,
            "process_x_warm": process / warm,
        }

    triton = {"kernels": 8, "fetch_s": 0.1, "upload_s": 0.0, "process_s": 5.0}
    results = {
        **report.provenance(),
        "machine": machine.describe(),
        "stores": {},
        "compile": {
            "python": "/venv/bin/python",
            "artifact_dir": "/tmp/x",
            "cases": {
                "cold": case(40.0, 20.0),
                "warm": case(10.0, 2.0),
                "new node, local dir": {
                    **case(9.5, 1.8),
                    "process_x_warm": 0.97,
                    "process_x_warm_runs": [0.97, 0.95, 1.02],
                },
                "new node, S3": {
                    **case(10.4, 1.9),
                    "process_x_warm": 1.04,
                    "process_x_warm_runs": [1.04, 1.0, 1.1],
                },
            },
            "worker": {
                "cold": {"ready_s": 16.0, "engine_config_s": 9.0, "mode": "profiled"},
                "warm": {"ready_s": 7.5, "engine_config_s": 1.0, "mode": "hit"},
                "new node": {"ready_s": 7.6, "engine_config_s": 1.1, "mode": "hit"},
            },
            "triton": {
                "cold": {**triton, "compiled": 8, "compile_s": 3.4},
                "warm": {**triton, "compiled": 0, "compile_s": 0.1},
                "new node": {**triton, "compiled": 0, "compile_s": 0.1},
            },
        },
    }
    path = tmp_path / "results.json"
    report.write_json(results, path)
    return load(path)


def test_every_quote_is_what_the_committed_results_file_gives() -> None:
    wrong = stale(load(RESULTS), ROOT)
    assert not wrong, (
        f"figures that differ from {RESULTS.relative_to(ROOT)} in "
        f"{', '.join(str(p.relative_to(ROOT)) for p in wrong)}: run "
        f"`python -m benchmarks.figures --results {RESULTS.relative_to(ROOT)} --write`"
    )


def test_the_quoting_pages_quote_through_markers_and_every_block_is_quoted() -> None:
    used = {
        name
        for path in documents(ROOT)
        for name, _ in MARKED.findall(path.read_text())
        if str(path.relative_to(ROOT)) in QUOTING
    }
    for page in QUOTING:
        assert MARKED.search((ROOT / page).read_text()), f"{page} quotes no figure through markers"
    assert used == set(blocks(load(RESULTS)))


def test_the_committed_results_file_is_small_and_says_which_run_it_is() -> None:
    assert RESULTS.stat().st_size < 50_000  # else commit what --copy-to writes
    assert {"date", "commit", "machine"} <= load(RESULTS).keys()


def test_a_changed_figure_is_found_and_written_back(tmp_path: Path) -> None:
    for path in documents(ROOT):
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    compile_md = tmp_path / "docs" / "compile.md"
    good = compile_md.read_text()
    compile_md.write_text(
        re.sub(r"(<!-- figures:new-node-x-warm -->)[^<]*", r"\g<1>9.99x", good, count=1)
    )
    assert list(stale(load(RESULTS), tmp_path)) == [compile_md]
    assert stale(load(RESULTS), tmp_path)[compile_md] == good


def test_a_results_file_the_main_job_writes_gives_every_quote(tmp_path: Path) -> None:
    results = _main_job_results(tmp_path)
    assert isinstance(results["date"], str) and isinstance(results["commit"], str)
    quoted = blocks(results)
    readme = quoted["readme-headline"].replace("\n", " ")
    assert (
        "9.5 s against 10.0 s for a warm node (0.97x, the median of 3 pairs booted side by side:"
        " 0.95-1.02x) and 40.0 s cold, from S3 in 10.4 s (1.04x, 1.00-1.10x)" in readme
    )
    assert "none of the 8 real Triton kernels" in quoted["readme-headline"].replace("\n", " ")
    measured = quoted["compile-measured"].replace("\n", " ")
    assert "3 pairs per store of a new node and a warm node booted side by side" in measured
    assert "against 10.0 s warm (0.97x, 0.95-1.02x; 1.04x, 1.00-1.10x)" in measured
    assert "the real `Worker` path to ready 7.6 s against 7.5 s warm and 16.0 s cold" in measured
    assert "none of the 8 Triton kernels the cold node compiled (3.4 s)" in measured
    assert "| - |" not in quoted["compile-boots"]  # every cell has its figure
    assert quoted["new-node-x-warm"] == (
        "0.97x from a directory and 1.04x from S3 (medians of 3 pairs per store, 0.95-1.10x in all)"
    )
    assert "| new node, S3 (moto) | 10.4 s | 1.04x (1.00-1.10x) |" in quoted["compile-boots"]
    assert quoted["new-node-seconds"] == "9.5-10.4 s against 10.0 s warm"


def test_the_copy_to_commit_holds_the_cited_figures_only(tmp_path: Path) -> None:
    results = _main_job_results(tmp_path)
    copy = tmp_path / "main-job.json"
    assert figures.main(["--results", str(tmp_path / "results.json"), "--copy-to", str(copy)]) == 0
    copied = load(copy)
    assert blocks(copied) == blocks(results)
    assert copied["source"].endswith("results.json")
    assert set(copied) == {"source", "date", "commit", "machine", "compile"}
    assert set(copied["compile"]["cases"]["cold"]) == set(figures.CITED["cases"]) - {
        "process_x_warm_runs"  # a new node's only
    }
    assert set(copied["compile"]["cases"]["new node, S3"]) == set(figures.CITED["cases"])
    assert copy.stat().st_size < 50_000


def test_a_run_without_the_compile_stage_is_refused(tmp_path: Path) -> None:
    results = _main_job_results(tmp_path)
    del results["compile"]
    with pytest.raises(ResultsError, match=r"no compile\.cases\.cold\.process_s"):
        blocks(results)
    path = tmp_path / "no-compile.json"
    path.write_text(json.dumps(results))
    assert figures.main(["--results", str(path), "--check"]) == 2


def test_the_command_checks_the_docs() -> None:
    assert figures.main(["--results", str(RESULTS), "--check"]) == 0


def test_a_run_without_pairs_is_quoted_with_its_one_ratio_per_store(tmp_path: Path) -> None:
    """A results file of a run before the pairs (one new node and one warm node per store)
    still gives every quote, each new node with its one ratio."""
    results = _main_job_results(tmp_path)
    for case in ("new node, local dir", "new node, S3"):
        del results["compile"]["cases"][case]["process_x_warm_runs"]
    quoted = blocks(results)
    assert "for a warm node (0.97x) and 40.0 s cold" in quoted["readme-headline"].replace("\n", " ")
    assert quoted["new-node-x-warm"] == "0.97-1.04x"
    assert "| new node, S3 (moto) | 10.4 s | 1.04x |" in quoted["compile-boots"]
