"""The headline figures of the README and the docs, from one run of the main job.

The prose quotes the main job's compile boots (a new node's whole process against a warm
and a cold node's, from a shared directory and from S3, its first forward, and where the run
measured them the real ``Worker`` path and Triton's kernels) in several places. Each quote
sits between two marker comments, ``<!-- figures:NAME -->`` and ``<!-- /figures -->``
(invisible once rendered), and its text is ``blocks(results)[NAME]``: one set of numbers,
those of the results file committed as ``docs/results/main-job.json`` (the ``results.json``
a run of ``python -m benchmarks`` writes to its ``--out``). The same markers hold the tables
of settings and bounds (``settings``, ``bounds``), generated from ``plancache._defaults``, the
one table every reader of a setting or a bound takes it from.

    python -m benchmarks.figures --results docs/results/main-job.json          # the blocks
    python -m benchmarks.figures --results docs/results/main-job.json --write  # into the docs
    python -m benchmarks.figures --results docs/results/main-job.json --check  # 1 if stale
    python -m benchmarks.figures --results benchmarks/results/results.json \
        --copy-to docs/results/main-job.json      # a run's cited figures, to commit

Keys read (as ``benchmarks/__main__.py`` and ``benchmarks/compile_share.py`` write them):
``date``, ``commit``, ``machine.cpu_count`` and ``machine.gpus``; under ``compile.cases``,
the cases ``cold``, ``warm``, ``new node, local dir`` and ``new node, S3``: ``process_s`` of
each, ``first_forward_s`` of the cold one and the new ones, ``process_x_warm`` and
``first_forward_ratio`` of the new ones, and where present ``process_runs_s`` (how many new
nodes each figure is the median of), the new ones' ``process_x_warm_runs`` (the ratio of each
pair of a new node and the warm node booted beside it: ``process_x_warm`` is then their
median, quoted with their spread) and the cold and warm nodes' ``process_x_warm``,
``first_forward_ratio`` and the warm node's ``first_forward_s`` (cells of the table);
``compile.worker.{cold,warm,new node}.ready_s`` and ``compile.triton.cold.compiled``,
``compile.triton.cold.compile_s``, ``compile.triton.new node.compiled``, where the run has
them (a clause each, left out where it does not).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from plancache._defaults import tables

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results" / "main-job.json"
"""The results file the docs quote."""
MARKED = re.compile(r"<!-- figures:([a-z][a-z0-9-]*) -->(.*?)<!-- /figures -->", re.S)
"""A quote in the docs: its block's name (lower case: ``figures:NAME`` is how the docs name
the marker itself), then its text."""
CASES = {"cold": "cold", "warm": "warm", "local": "new node, local dir", "s3": "new node, S3"}
"""The compile stage's cases, by the short names used here."""
WIDTH = 92
"""Line width of the blocks that are paragraphs' sentences (the others stay on one line)."""
COMMAND = "`python3 -m tox -e bench`"
CITED = {
    "cases": (
        "process_s",
        "process_x_warm",
        "first_forward_s",
        "first_forward_ratio",
        "process_runs_s",
        "process_x_warm_runs",
    ),
    "worker": ("ready_s",),
    "triton": ("compiled", "compile_s"),
}
"""The figures of each node the blocks read, by the part of ``results["compile"]`` it is in."""
_UNIT = re.compile(r"(\d) s\b")


class ResultsError(ValueError):
    """The results file lacks a figure the prose needs, or holds one of the wrong type."""


def documents(root: Path = REPO) -> list[Path]:
    """The files whose quotes are kept in step: the README, the changelog and the docs."""
    return [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]


def load(path: Path) -> dict[str, Any]:
    """The results file at ``path``; ``ResultsError`` if it is not a JSON object."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: not a JSON object")
    return data


def _at(results: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise ResultsError(f"the results file has no {'.'.join(path)}")
        node = node[key]
    return node


def _number(results: Mapping[str, Any], *path: str) -> float:
    value = _at(results, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResultsError(f"{'.'.join(path)} is not a number: {value!r:.40}")
    return float(value)


def _text(results: Mapping[str, Any], *path: str) -> str:
    value = _at(results, path)
    if not isinstance(value, str) or not value:
        raise ResultsError(f"{'.'.join(path)} is not a text: {value!r:.40}")
    return value


def _optional(results: Mapping[str, Any], *path: str) -> float | None:
    """The number at ``path``, or None where the results file has nothing there."""
    try:
        return _number(results, *path)
    except ResultsError:
        return None


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _span(values: Iterable[float], show: Callable[[float], str]) -> str:
    """``show`` of the smallest and the largest value, ``8.4-8.6 s`` (one, where they read
    alike)."""
    low, high = show(min(values)), show(max(values))
    if low == high:
        return low
    unit = low.lstrip("0123456789.")
    return f"{low.removesuffix(unit)}-{high}"


def _case(results: Mapping[str, Any], case: str, key: str) -> float:
    return _number(results, "compile", "cases", CASES[case], key)


def _machine(results: Mapping[str, Any]) -> str:
    cores = int(_number(results, "machine", "cpu_count"))
    gpus = _at(results, ("machine", "gpus"))
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        raise ResultsError(f"machine.gpus is not a list of names: {gpus!r:.60}")
    return f"a {cores}-core CPU machine " + (f"with {', '.join(gpus)}" if gpus else "without a GPU")


def _run(results: Mapping[str, Any]) -> str:
    """Which run: the command, date, commit and machine."""
    date, commit = _text(results, "date"), _text(results, "commit")
    return f"{COMMAND}, {date} at {commit}, {_machine(results)}"


def _nodes(results: Mapping[str, Any]) -> str:
    """How many new nodes per store each figure is the median of (nothing where unknown)."""
    if _pairs(results, "local") and _pairs(results, "s3"):
        n = len(_pairs(results, "local"))
        return f", {n} pairs per store of a new node and a warm node booted side by side"
    runs = [
        _at(results, ("compile", "cases", CASES[c])).get("process_runs_s") for c in ("local", "s3")
    ]
    counts = {len(r) for r in runs if isinstance(r, list)}
    if len(counts) != 1:
        return ""
    (n,) = counts
    return ", one new node per store" if n == 1 else f", the median of {n} new nodes per store"


def _pairs(results: Mapping[str, Any], case: str) -> list[float]:
    """The ratios of ``case``'s pairs (a new node over the warm node booted beside it), or
    none where the run did not boot pairs."""
    runs = _at(results, ("compile", "cases", CASES[case])).get("process_x_warm_runs")
    if not isinstance(runs, list) or not runs:
        return []
    if not all(isinstance(r, int | float) and not isinstance(r, bool) for r in runs):
        raise ResultsError(f"compile.cases.{CASES[case]}.process_x_warm_runs holds a non-number")
    return [float(r) for r in runs]


def _ratio(results: Mapping[str, Any], case: str, long: bool = False) -> str:
    """``case``'s whole process over a warm node's: the median pair's and the pairs' spread
    (``long``: saying what they are), or the one ratio of a run without pairs."""
    ratio, pairs = _x(_case(results, case, "process_x_warm")), _pairs(results, case)
    if not pairs:
        return ratio
    if long:
        return f"{ratio}, the median of {len(pairs)} pairs booted side by side: {_span(pairs, _x)}"
    return f"{ratio}, {_span(pairs, _x)}"


def _worker(results: Mapping[str, Any]) -> str:
    """The real ``Worker`` path's clause, or nothing where the run did not measure it."""
    ready = [
        _optional(results, "compile", "worker", n, "ready_s") for n in ("new node", "warm", "cold")
    ]
    if any(r is None for r in ready):
        return ""
    new, warm, cold = (_s(r) for r in ready if r is not None)
    return f"; the real `Worker` path to ready {new} against {warm} warm and {cold} cold"


def _triton(results: Mapping[str, Any], *, prefix: str, what: str) -> str:
    """Triton's clause (``prefix``, then what the new node compiled, ``what`` the kernels
    are), or nothing where the run did not measure it."""
    new = _optional(results, "compile", "triton", "new node", "compiled")
    cold = _optional(results, "compile", "triton", "cold", "compiled")
    seconds = _optional(results, "compile", "triton", "cold", "compile_s")
    if new is None or cold is None or seconds is None:
        return ""
    compiled = "none" if new == 0 else f"{new:.0f}"
    return f"{prefix}{compiled} of the {cold:.0f} {what} the cold node compiled ({_s(seconds)})"


def _table(results: Mapping[str, Any]) -> str:
    """The compile boots as a Markdown table, between blank lines; ``-`` where the results
    file has no figure."""
    rows = [
        "| node | whole process | x warm | first forward | x cold |",
        "|---|---|---|---|---|",
    ]
    names = {
        "cold": "cold",
        "warm": "warm",
        "local": "new node, shared directory",
        "s3": "new node, S3 (moto)",
    }
    for case, name in names.items():
        cells = [
            (_optional(results, "compile", "cases", CASES[case], key), show)
            for key, show in (
                ("process_s", _s),
                ("process_x_warm", _x),
                ("first_forward_s", _s),
                ("first_forward_ratio", _x),
            )
        ]
        shown = ["-" if value is None else show(value) for value, show in cells]
        ratios = _pairs(results, case) if case in ("local", "s3") else []
        if ratios:  # the median pair's ratio, and the pairs' spread
            shown[1] += f" ({_span(ratios, _x)})"
        rows.append(f"| {name} | {' | '.join(shown)} |")
    pairs = _nodes(results) if _pairs(results, "local") else ""
    caption = _wrapped(
        f"The compile boots of the main job ({_run(results)}{pairs}; "
        "`docs/results/main-job.json`), whose figures the README and the other pages quote"
        + (
            ": each case its median boot; a new node's x warm, the median of its pairs' "
            "ratios, their spread in brackets:"
            if pairs
            else ":"
        )
    )
    return "\n\n" + caption + "\n\n" + "\n".join(rows) + "\n\n"


def _wrapped(text: str) -> str:
    """``text`` on lines of at most ``WIDTH`` characters, never between a number and its
    unit."""
    kept = _UNIT.sub("\\1\0s", text)
    return textwrap.fill(kept, WIDTH, break_long_words=False, break_on_hyphens=False).replace(
        "\0", " "
    )


def blocks(results: Mapping[str, Any]) -> dict[str, str]:
    """The text of every quote, by its block's name (``ResultsError`` where the results
    file lacks a figure a block needs)."""
    cold, warm = _case(results, "cold", "process_s"), _case(results, "warm", "process_s")
    local, s3 = _case(results, "local", "process_s"), _case(results, "s3", "process_s")
    x_local, x_s3 = (
        _case(results, "local", "process_x_warm"),
        _case(results, "s3", "process_x_warm"),
    )
    pairs = _pairs(results, "local") + _pairs(results, "s3")
    ratio_local, ratio_s3 = (_case(results, c, "first_forward_ratio") for c in ("local", "s3"))
    readme = (
        f"measured here ({_run(results)}, real vLLM 0.33, a tiny model), a new node fed from a "
        f"shared directory ran its whole process in {_s(local)} against {_s(warm)} for a warm "
        f"node ({_ratio(results, 'local', long=True)}) and {_s(cold)} cold, from S3 in "
        f"{_s(s3)} ({_ratio(results, 's3')}), its "
        f"first forward in {_x(ratio_local)} the cold node's compile"
        + _triton(results, prefix=", and it compiled ", what="real Triton kernels (sm_90 target)")
    )
    measured = (
        f"The main job ({_run(results)}{_nodes(results)}): a new node's whole process took "
        f"{_s(local)} from a shared directory and {_s(s3)} from S3 (moto), against {_s(warm)} "
        f"warm ({_ratio(results, 'local')}{'; ' if pairs else ', '}{_ratio(results, 's3')}) and "
        f"{_s(cold)} cold; its "
        "first forward "
        f"{_span((ratio_local, ratio_s3), _x)} the cold node's"
        + _worker(results)
        + _triton(results, prefix="; and it compiled ", what="Triton kernels")
        + "."
    )
    return tables() | {
        "readme-headline": _wrapped(readme),
        "compile-measured": _wrapped(measured),
        "compile-boots": _table(results),
        "new-node-x-warm": (
            f"{_x(x_local)} from a directory and {_x(x_s3)} from S3 (medians of "
            f"{len(pairs) // 2} pairs per store, {_span(pairs, _x)} in all)"
            if pairs
            else _span((x_local, x_s3), _x)
        ),
        "new-node-seconds": f"{_span((local, s3), _s)} against {_s(warm)} warm",
    }


def cited(results: Mapping[str, Any], source: str) -> dict[str, Any]:
    """What of ``results`` the blocks read (``date``, ``commit``, ``machine`` and the compile
    figures ``CITED`` names), with ``source`` saying where it came from: a results file small
    enough to commit that gives the same blocks."""
    out: dict[str, Any] = {"source": source}
    out |= {key: results[key] for key in ("date", "commit", "machine") if key in results}
    stage = results.get("compile")
    for part, keys in CITED.items():
        nodes = stage.get(part) if isinstance(stage, Mapping) else None
        if isinstance(nodes, Mapping):
            out.setdefault("compile", {})[part] = {
                name: {k: v for k, v in node.items() if k in keys}
                for name, node in nodes.items()
                if isinstance(node, Mapping)
            }
    return out


def render(text: str, generated: Mapping[str, str], where: str = "") -> str:
    """``text`` with every quote's text replaced by its block's; ``ResultsError`` naming
    ``where`` for a block name that does not exist."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in generated:
            raise ResultsError(f"{where}: no block named {name!r} (known: {', '.join(generated)})")
        return f"<!-- figures:{name} -->{generated[name]}<!-- /figures -->"

    return MARKED.sub(replace, text)


def stale(results: Mapping[str, Any], root: Path = REPO) -> dict[Path, str]:
    """The documents whose quotes differ from what ``results`` gives, each with its text as
    it should be."""
    generated = blocks(results)
    out = {}
    for path in documents(root):
        text = path.read_text()
        wanted = render(text, generated, str(path.relative_to(root)))
        if wanted != text:
            out[path] = wanted
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.figures",
        description="The docs' headline figures from a main job's results.json.",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="a main job's results.json")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the quotes in the docs")
    action.add_argument("--check", action="store_true", help="exit 1 if a quote differs")
    action.add_argument(
        "--copy-to", type=Path, metavar="PATH", help="write the figures the blocks read to PATH"
    )
    args = parser.parse_args(argv)
    try:
        results = load(args.results)
        if args.copy_to is not None:
            copy = cited(results, f"copied by {parser.prog} --copy-to from {args.results}")
            blocks(copy)  # it gives every block
            args.copy_to.write_text(json.dumps(copy, indent=2) + "\n")
            return 0
        if not (args.write or args.check):
            for name, text in blocks(results).items():
                print(f"{name}:\n{text.strip()}\n")
            return 0
        changed = stale(results)
    except (OSError, ValueError) as exc:  # ResultsError and bad JSON are ValueErrors
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    for path, text in changed.items():
        if args.write:
            path.write_text(text)
        print(f"{'rewrote' if args.write else 'stale'}: {path.relative_to(REPO)}")
    return 1 if changed and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
