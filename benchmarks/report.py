"""The benchmark's outputs: the headline table the terminal ends with, every table (a text
file), every figure (a JSON file) and a PNG plot that leads with what plancache saves."""

from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import compile_share, herd, plugin_costs, rollout

PLOT = "plot"
REPO = Path(__file__).resolve().parent.parent


def _us(p: dict[str, Any]) -> str:
    if not p or p.get("n", 0) == 0 or math.isnan(p["p50_us"]):
        return "-"
    return f"{p['p50_us']:9.1f} / {p['p99_us']:9.1f}"


def table(results: dict[str, Any]) -> str:
    """Every table: the compile-artifact boots, the stores, the fleet, contention and the
    plugin's critical-path cost."""
    lines = [compile_share.table(results["compile"]), ""] if "compile" in results else []
    lines += [
        f"machine: {results['machine']['cpu']} x{results['machine']['cpu_count']}, "
        f"{results['machine']['memory_gib']:.0f} GiB, GPUs: "
        f"{', '.join(results['machine']['gpus']) or 'none'}"
    ]
    imp = results.get("import")
    if imp:
        lines.append(
            f"import plancache: +{imp['added_ms']:.1f} ms over a bare interpreter "
            f"({imp['bare_interpreter_ms']:.1f} ms); heavy modules loaded: "
            f"{', '.join(imp['heavy_modules_loaded']) or 'none'}"
        )
    if results["stores"]:
        lines.append("")
        lines.append(f"{'store latency (us)':34s} {'p50 / p99':>21s}  requests")
    for backend, figures in results["stores"].items():
        for op, p in figures.items():
            if isinstance(p, dict) and "p50_us" in p:
                req = figures.get("requests", {}).get(op, "")
                lines.append(f"  {backend + ' ' + op:32s} {_us(p):>21s}  {req}")
    for backend, ratio in hit_ratios(results).items():
        lines.append(f"  {backend} lookup hit / vLLM's built-in read (p50): {_times(ratio)}")
    fleet = results.get("fleet")
    if fleet:
        lines.append("")
        lines.append(
            f"fleet (SIMULATED profiling {fleet['profile_seconds_simulated']} s, "
            f"{fleet['nodes']} processes, {fleet['configs']} configs, {fleet['rounds']} rounds, "
            f"seed {fleet['seed']}, store {results.get('fleet_store', '-')})"
        )
        lines.append(
            f"  {'set-up':10s} {'profiles':>8s} {'per round':>16s} {'saved (s)':>10s} "
            f"{'lookup p50/p99 (us)':>22s} {'valid':>6s} {'given up mean/max MiB':>22s}"
        )
        for name, f in fleet["setups"].items():
            g = f["capacity_given_up"]
            lines.append(
                f"  {name:10s} {f['profiles_paid']:8d} {f['profiles_paid_per_round']!s:>16s} "
                f"{f['simulated_seconds_saved']:10.1f} {_us(f['lookup']):>22s} "
                f"{f['nodes_with_valid_plan']:3d}/{fleet['nodes']} "
                f"{g['mean_mib']:10.1f} / {g['max_mib']:.1f}"
            )
    sweep = results.get("fleet_sweep")
    if sweep:
        lines.append("")
        lines.append(
            f"fleet sweep ({sweep['seeds']} seeds, SIMULATED time, {sweep['nodes']} nodes, "
            f"{sweep['rounds']} rounds, free memory ±{sweep['free_memory_spread_gib']:.0f} GiB, "
            f"KV jitter ±{sweep['kv_jitter_mib']:.0f} MiB, stragglers; {sweep['store']})"
        )
        lines.append(
            f"  {'policy':13s} {'mean profiles per round':>28s} {'clean seeds':>11s} "
            f"{'last round, per seed':>32s} {'given up mean/max MiB (%)':>28s}"
        )
        for name, f in sweep["policies"].items():
            g = f["capacity_given_up"]
            per_round = "[" + ", ".join(f"{x:.1f}" for x in f["mean_profiles_per_round"]) + "]"
            lines.append(
                f"  {POLICY_LABELS[name]:13s} {per_round:>28s} "
                f"{f['seeds_with_no_node_profiling_again']:>5d}/{sweep['seeds']:<5d} "
                f"{f['profiling_in_last_round']!s:>32s} "
                f"{g['mean_mib']:6.1f} / {g['max_mib']:.1f} ({g['mean_pct']:.3f} / "
                f"{g['max_pct']:.3f} %)"
            )
        lines.append("  clean seeds: no node profiled again after its first profile, in any round")
    if results.get("contention"):
        lines.append("")
        lines.append(
            "write contention: writers put one observation each on one key at once "
            "(requests: the store's primitive calls; sim: 5 ms per call, in-process)"
        )
        lines.append(contention_table(results["contention"]))
    if results.get("rollout"):
        lines += ["", rollout.table(results["rollout"])]
    if results.get("herd"):
        lines += ["", herd.table(results["herd"])]
    lines.append("")
    lines.append(f"real boot: {results['boot']}")
    if "plugin_costs" in results:
        lines += ["", plugin_costs.table(results["plugin_costs"])]
    return "\n".join(lines)


def contention_table(results: dict[str, Any]) -> str:
    """One line per contention run (``benchmarks.contention``): requests and seconds per
    put (p50 / p99 / max), writers that gave up, observations lost."""
    lines = [
        f"  {'store':6s} {'workload':9s} {'writers':>7s} {'requests p50/p99/max':>21s} "
        f"{'seconds p50/p99/max':>24s} {'gave up':>7s} {'lost':>5s}"
    ]
    for backend, by_workload in results.items():
        for workload, by_n in by_workload.items():
            for n, r in by_n.items():
                q, s = r["requests"], r["seconds"]
                lines.append(
                    f"  {backend:6s} {workload:9s} {n:>7s} "
                    f"{q['p50']:>7g} /{q['p99']:>4g} /{q['max']:>4g} "
                    f"{s['p50']:>8.3f} /{s['p99']:>6.3f} /{s['max']:>6.3f} "
                    f"{r['gave_up']:>7d} {r['lost']:>5d}"
                )
    return "\n".join(lines)


POLICY_LABELS = {
    "per-node": "per-node",
    "single-point": "before (1 pt)",
    "frontier": "after (front.)",
}
BASELINE = ("local", "baseline_vllm_load_plan")
"""vLLM's built-in read of the same plan (``local_costs.vllm_load_plan``: its ``_load_plan``,
step for step)."""
CORE = ("local", "baseline_open_json_load")
"""The core of that read alone: ``open`` + ``json.load`` of the file."""


def hit_ratios(results: dict[str, Any]) -> dict[str, float]:
    """Each backend's ``lookup_hit`` p50 as a multiple of vLLM's built-in read (p50)."""
    stores = results["stores"]
    base = stores.get(BASELINE[0], {}).get(BASELINE[1], {})
    if not base.get("n"):
        return {}
    return {
        backend: figures["lookup_hit"]["p50_us"] / base["p50_us"]
        for backend, figures in stores.items()
        if isinstance(figures.get("lookup_hit"), dict) and figures["lookup_hit"].get("n")
    }


def provenance(repo: Path = REPO) -> dict[str, str | None]:
    """Which run ``results.json`` holds: ``date`` (UTC, now: call it when the run starts) and
    ``commit`` (the checkout's short hash, with ``-dirty`` where tracked files differ from
    it; None outside a git checkout). ``benchmarks.figures`` quotes both."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "--no-optional-locks", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    date = time.strftime("%Y-%m-%d", time.gmtime())
    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"date": date, "commit": None}
    if head.returncode != 0:
        return {"date": date, "commit": None}
    dirty = "-dirty" if changed.returncode != 0 or changed.stdout.strip() else ""
    return {"date": date, "commit": head.stdout.strip() + dirty}


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))


def outputs(out: Path) -> dict[str, Path]:
    """The files a run writes under ``out``, by what they hold."""
    return {
        "figures": out / "results.json",
        "tables": out / "tables.txt",
        PLOT: out / "results.png",
        "log": out / "bench.log",
    }


@dataclass(frozen=True)
class Row:
    """One line of the headline: what, the figure in words, and for a saving the seconds it
    saves per boot (None: no bar to draw). ``measured`` is False for a figure this run could
    not measure; ``text`` then says why."""

    label: str
    text: str
    seconds: float | None = None
    measured: bool = True


def _why_missing(results: dict[str, Any], stage: str) -> str:
    """Why ``stage`` measured nothing in this run: its status (``skipped: ...``,
    ``failed: ...``)."""
    status: str = results.get("stages", {}).get(stage, {}).get("status", "not run")
    return status


def _time(us: float) -> str:
    """Microseconds in the unit that reads best."""
    if us < 1e3:
        return f"{us:.0f} µs"
    return f"{us / 1e3:.1f} ms" if us < 1e6 else f"{us / 1e6:.2f} s"


def _times(ratio: float) -> str:
    """A multiple, to two significant digits."""
    return f"{ratio:.2g}x" if ratio < 100 else f"{ratio:.0f}x"


def savings(results: dict[str, Any]) -> list[Row]:
    """What plancache saved per boot in this run, whole boot first: a new node fed from the
    store (compile artifact and model info; real vLLM processes) against a warm and a cold
    one, then KV-cache profiles avoided by the fleet (simulated profiling time); a row that
    says why for each one this run could not measure."""
    rows: list[Row] = []
    compiled = results.get("compile", {})
    cases = compiled.get("cases", {})
    warm = cases.get("warm", {}).get("process_s")
    for name, case in cases.items():
        if name.startswith("new node"):
            where = name.removeprefix("new node, ").replace("dir", "directory")
            cold = case["first_forward_s"] + case["first_forward_saved_s"]
            process, saved = case["process_s"], case["process_saved_s"]
            versus = f"{process / warm:.2f}x warm, " if warm else ""
            ratios = case.get("process_x_warm_runs")
            if ratios:  # the median pair's ratio and the pairs' spread
                versus = (
                    f"{case['process_x_warm']:.2f}x the warm node beside it, median of "
                    f"{len(ratios)} pairs, {min(ratios):.2f}-{max(ratios):.2f}x; "
                )
            rows.append(
                Row(
                    f"whole boot: new node, store: {where}",
                    f"process {process:.1f} s ({versus}{process + saved:.1f} s cold): "
                    f"{saved:.1f} s saved; first forward {case['first_forward_s']:.1f} s vs "
                    f"{cold:.1f} s cold ({case['first_forward_ratio']:.2f}x; real vLLM)",
                    saved,
                )
            )
    if "cases" not in compiled:
        why = compiled.get("skipped") or _why_missing(results, "compile")
        rows.append(Row("whole boot: new node, store", why, measured=False))
    worker = compiled.get("worker", {})
    if "new node" in worker:
        new, warm_w, cold_w = worker["new node"], worker["warm"], worker["cold"]
        rows.append(
            Row(
                "whole boot: real Worker to ready, new node",
                f"{new['ready_s']:.1f} s ({new['ready_s'] / warm_w['ready_s']:.2f}x warm, "
                f"{cold_w['ready_s']:.1f} s cold; vLLM's Worker, GPU counters faked)",
                cold_w["ready_s"] - new["ready_s"],
            )
        )
    triton = compiled.get("triton", {})
    if "new node" in triton:
        cold, new = triton["cold"], triton["new node"]
        rows.append(
            Row(
                "Triton kernels: new node, store: local directory",
                f"compiled {new['compiled']} of {new['kernels']} ({new['compile_s']:.1f} s) vs "
                f"{cold['compiled']} cold ({cold['compile_s']:.1f} s; real Triton, sm_90 target)",
                cold["compile_s"] - new["compile_s"],
            )
        )
    elif "skipped" in triton:
        rows.append(Row("Triton kernels: new node", triton["skipped"], measured=False))
    fleet = results.get("fleet")
    if fleet:
        labels = {
            "shared": f"KV profiling: fleet on {results.get('fleet_store', 'a shared store')}",
            "per-node": "KV profiling: per-node plans (vLLM built-in)",
        }
        for setup, label in labels.items():
            f = fleet["setups"][setup]
            timeouts = f["reasons"].get("timeout", 0)
            saved = f["simulated_seconds_saved"] / f["boots"]
            rows.append(
                Row(
                    label,
                    f"{f['boots'] - f['profiles_paid']}/{f['boots']} boots skipped profiling: "
                    f"{saved:.2f} s saved per boot (SIMULATED "
                    f"{fleet['profile_seconds_simulated']} s profile)"
                    + (f"; {timeouts} lookups timed out" if timeouts else ""),
                    saved,
                )
            )
    else:
        why = _why_missing(results, "fleet")
        rows.append(Row("KV profiling: fleet simulation", why, measured=False))
    sweep = results.get("fleet_sweep")
    if not sweep:
        why = _why_missing(results, "sweep")
        rows.append(Row("KV profiling: fleet sweep (simulated time)", why, measured=False))
    else:
        per_round = {
            name: "/".join(f"{x:.1f}" for x in f["mean_profiles_per_round"])
            for name, f in sweep["policies"].items()
        }
        clean = sweep["policies"]["frontier"]["seeds_with_no_node_profiling_again"]
        rows.append(
            Row(
                f"KV profiling: {sweep['seeds']} fleets of {sweep['nodes']} (simulated time)",
                f"profiles per round: shared {per_round['frontier']}, per-node "
                f"{per_round['per-node']}; no node profiled twice in {clean}/{sweep['seeds']}",
            )
        )
    if results.get("rollout"):
        rows.append(Row(*rollout.row(results["rollout"])))
    else:
        rows.append(Row("rollout simulation", _why_missing(results, "rollout"), measured=False))
    if "boot" in results:
        rows.append(Row("KV profiling and compile, real GPU boots", results["boot"], None, False))
    return rows


def costs(results: dict[str, Any]) -> list[Row]:
    """What plancache cost in this run: a lookup hit on each backend beside vLLM's built-in
    read, the plugin's critical path, ``import plancache``, and writes under contention."""
    rows: list[Row] = []
    stores = results["stores"]
    base = stores.get(BASELINE[0], {}).get(BASELINE[1])
    core = stores.get(CORE[0], {}).get(CORE[1])
    if base:
        text = f"{_time(base['p50_us'])} p50"
        if core:
            text += f"; its open + json.load alone {_time(core['p50_us'])}"
        rows.append(Row("vLLM's built-in read (_load_plan)", text))
    get = stores.get("local", {}).get("get_hit")
    if base and core and get:
        rows.append(
            Row(
                "LocalStore.get hit (every rule checked)",
                f"{_time(get['p50_us'])} p50: {_times(get['p50_us'] / base['p50_us'])} vLLM's "
                f"read, {_times(get['p50_us'] / core['p50_us'])} its open + json.load",
            )
        )
    for backend, ratio in hit_ratios(results).items():
        hit = stores[backend]["lookup_hit"]
        rows.append(
            Row(
                f"lookup hit, {BACKENDS.get(backend, backend)}",
                f"{_time(hit['p50_us'])} p50, {_time(hit['p99_us'])} p99: {_times(ratio)} "
                "vLLM's built-in read",
            )
        )
    plugin = results.get("plugin_costs", {}).get("stores", {})
    for what in ("hit", "miss", "save") if plugin else ():
        rows.append(
            Row(
                f"vLLM plugin's critical path: {what} (median ms)",
                ", ".join(
                    f"{store.removesuffix(' +0 ms')} {f[what + ' after']['median_ms']:.2f}"
                    for store, f in plugin.items()
                ),
            )
        )
    imp = results.get("import")
    if imp:
        heavy = ", ".join(imp["heavy_modules_loaded"]) or "no client library, vLLM or torch"
        rows.append(Row("import plancache", f"+{imp['added_ms']:.0f} ms; loads {heavy}"))
    runs = [
        r
        for by_workload in results.get("contention", {}).values()
        for by_n in by_workload.values()
        for r in by_n.values()
    ]
    if runs:
        writers = sorted(r["writers"] for r in runs)
        rows.append(
            Row(
                f"write contention: {writers[0]}-{writers[-1]} writers on one key",
                f"{len(runs)} runs: {sum(r['lost'] for r in runs)} observations lost, "
                f"{sum(r['gave_up'] for r in runs)} writers gave up; requests per put p99 "
                f"at most {max(r['requests']['p99'] for r in runs)}",
            )
        )
    missing = {
        "import": "import plancache",
        "local": "local store",
        "remote": "S3 and GCS",
        "plugin": "vLLM plugin's critical path",
        "contention": "write contention",
    }
    for stage, label in missing.items():
        status = results.get("stages", {}).get(stage, {}).get("status", "measured")
        if status != "measured":
            rows.append(Row(label, _why_missing(results, stage), measured=False))
    return rows


BACKENDS = {
    "s3": "S3 (moto, loopback)",
    "gcs": "GCS (fake-gcs-server behind its precondition proxy, loopback)",
}


def headline(results: dict[str, Any]) -> str:
    """The table the run ends with: what plancache saved, what it cost, what could not be
    measured here (and why), and what failed."""
    m = results["machine"]
    sections = {
        "WHAT IT SAVES AT BOOT": [r for r in savings(results) if r.measured],
        "WHAT IT COSTS": [r for r in costs(results) if r.measured],
        "NOT MEASURED HERE": [r for r in [*savings(results), *costs(results)] if not r.measured],
        "FAILED (traceback in the log)": [
            Row(results["stages"][stage]["what"], error)
            for stage, error in results.get("failed", {}).items()
        ],
    }
    width = max(len(r.label) for rows in sections.values() for r in rows)
    title = (
        f"headline results: {m['cpu']} x{m['cpu_count']}, {m['memory_gib']:.0f} GiB, "
        f"GPUs: {', '.join(m['gpus']) or 'none'}"
    )
    lines = [title, "-" * len(title)]
    for heading, rows in sections.items():
        if rows:
            lines.append(heading)
            lines += [f"  {r.label:{width}s}  {r.text}" for r in rows]
    return "\n".join(lines)


def summary(results: dict[str, Any], log_counts: dict[str, int], log: Path) -> str:
    """One line: stages measured, skipped and failed, the seconds, and the log's warnings."""
    statuses = [s["status"].split(":")[0] for s in results["stages"].values()]
    return (
        f"{len(statuses)} stages in {results['wall_seconds']:.0f} s: "
        f"{statuses.count('measured')} ran, {statuses.count('skipped')} skipped, "
        f"{statuses.count('failed')} failed; worker and library output in {log} "
        f"({log_counts['WARNING']} warning and {log_counts['ERROR']} error lines)"
    )


def paths(files: dict[str, Path], stages: dict[str, dict[str, Any]]) -> str:
    """Where the full outputs are (the plot's line says why when it was not written)."""
    names = {
        "figures": "every figure (JSON)",
        "tables": "every table",
        PLOT: "plot",
        "log": "log of workers and libraries",
    }
    lines = ["outputs:"]
    for key, path in files.items():
        status = stages.get(key, {}).get("status", "measured")
        shown = path if status == "measured" else f"not written ({status})"
        lines.append(f"  {names[key]:30s} {shown}")
    return "\n".join(lines)


def figure(results: dict[str, Any]) -> Any:
    """The plot as a matplotlib figure: what plancache saves per boot first (top left: every
    saving this run measured, and a line saying why for each one it could not), then the
    fleet's profiles per round, the compile-artifact boots, and last what it costs (store
    operation latency per backend, a hit's multiple of vLLM's built-in read beside it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(19, 13), gridspec_kw={"width_ratios": [1.3, 1]})
    _plot_savings(axes[0][0], savings(results))
    _plot_sweep(axes[0][1], results)
    if "cases" in results.get("compile", {}):
        compile_share.plot_boots(axes[1][0], results["compile"])
    else:
        why = results.get("compile", {}).get("skipped") or _why_missing(results, "compile")
        _not_measured(axes[1][0], "vLLM compile: cold vs warm vs new node", why)
    _plot_costs(axes[1][1], results)
    m = results["machine"]
    fig.suptitle(
        f"plancache: what it saves at boot, and what it costs ({m['cpu']} x{m['cpu_count']}, "
        f"GPUs: {', '.join(m['gpus']) or 'none'})",
        fontsize=13,
    )
    fig.tight_layout()
    return fig


def plot(results: dict[str, Any], path: Path) -> None:
    """Write ``figure(results)`` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = figure(results)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _not_measured(ax: Any, title: str, why: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, color="dimgray")
    ax.set_axis_off()


def _plot_savings(ax: Any, rows: list[Row]) -> None:
    """One bar per saving measured (seconds saved per boot, on a log scale that keeps a
    tenth of a second beside tens of seconds, its words beside it), one line per saving not
    measured here (why)."""
    shown = [r for r in rows if r.seconds is not None or not r.measured]
    ys = list(range(len(shown)))
    seconds = [r.seconds or 0.0 for r in shown]
    colors = ["tab:green" if r.label.startswith("compile") else "tab:blue" for r in shown]
    ax.barh(ys, seconds, 0.6, color=colors)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlim(0, max([*seconds, 1.0]) * 1e3)  # room for the words
    for y, r, x in zip(ys, shown, seconds, strict=True):
        ax.text(
            max(x, 0.0) * 1.15 + 0.01,
            y,
            r.text if r.measured else f"not measured here: {r.text}",
            va="center",
            fontsize=8,
            color="black" if r.measured else "dimgray",
            style="normal" if r.measured else "italic",
        )
    ax.set_yticks(ys, [r.label for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds saved per boot (log; measured here, fleet profiling SIMULATED)")
    ax.set_title("what plancache SAVES per boot")


def _plot_sweep(ax: Any, results: dict[str, Any]) -> None:
    """The fleet sweep's mean profiles per round, per policy."""
    sweep = results.get("fleet_sweep")
    if not sweep:
        _not_measured(ax, "fleet: profiles paid per round", _why_missing(results, "sweep"))
        return
    rounds = list(range(1, sweep["rounds"] + 1))
    styles = {
        "per-node": ("tab:gray", "s--", "per-node local plans (vLLM built-in)"),
        "single-point": ("tab:red", "o-", "shared, before: one point per key"),
        "frontier": ("tab:green", "^-", "shared, after: frontier (plancache)"),
    }
    for name, f in sweep["policies"].items():
        color, style, label = styles[name]
        clean = f["seeds_with_no_node_profiling_again"]
        ax.plot(
            rounds,
            f["mean_profiles_per_round"],
            style,
            color=color,
            label=f"{label} ({clean}/{sweep['seeds']} seeds clean)",
        )
    ax.set_xticks(rounds)
    ax.set_xlabel("round of boots")
    ax.set_ylabel(f"profiles paid (mean of {sweep['seeds']} seeds, of {sweep['nodes']} nodes)")
    ax.set_title(
        f"fleet: profiles avoided (±{sweep['free_memory_spread_gib']:.0f} GiB free,\n"
        f"±{sweep['kv_jitter_mib']:.0f} MiB KV jitter, stragglers; simulated time)"
    )
    ax.legend(fontsize=8, title="clean: no node profiles after its first profile", title_fontsize=8)


def _plot_costs(ax: Any, results: dict[str, Any]) -> None:
    """Latency per backend and operation (p50, p99; log scale), each backend's lookup hit
    labelled with its multiple of vLLM's built-in read."""
    title = "what it COSTS: store operation latency by backend (this machine)"
    if not results["stores"]:
        why = _why_missing(results, "local")
        _not_measured(ax, title, why)
        return
    ratios = hit_ratios(results)
    labels: list[str] = []
    p50: list[float] = []
    p99: list[float] = []
    ys: list[float] = []
    y = 0.0
    for backend, figures in results["stores"].items():
        for op, p in figures.items():
            if isinstance(p, dict) and p.get("n"):
                ratio = f"  ({_times(ratios[backend])} built-in)" if op == "lookup_hit" else ""
                labels.append(f"{backend}  {op}{ratio if backend in ratios else ''}")
                p50.append(p["p50_us"])
                p99.append(p["p99_us"])
                ys.append(y)
                y += 1
        y += 0.8  # a gap between backends
    ax.barh([v - 0.2 for v in ys], p50, 0.4, label="p50")
    ax.barh([v + 0.2 for v in ys], p99, 0.4, label="p99")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("microseconds (log)")
    ax.set_title(title)
    ax.legend(loc="lower right")
