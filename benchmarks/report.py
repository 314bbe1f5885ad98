"""The benchmark's outputs: a terminal table, a JSON file and a PNG plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _us(p: dict[str, Any]) -> str:
    if not p or p.get("n", 0) == 0 or math.isnan(p["p50_us"]):
        return "-"
    return f"{p['p50_us']:9.1f} / {p['p99_us']:9.1f}"


def table(results: dict[str, Any]) -> str:
    """Plain-text summary of every figure measured."""
    lines = [
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
        lines.append(f"  {backend} hit / vLLM's built-in read (p50): {ratio:.1f}x")
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
    lines.append("")
    lines.append(f"real boot: {results['boot']}")
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
BASELINE = ("local", "baseline_open_json_load")
"""vLLM's built-in read of the same plan: ``open`` + ``json.load`` of a local file."""


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


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))


def plot(results: dict[str, Any], path: Path) -> None:
    """The compile-artifact boots (first, when measured), latency per backend and operation
    (grouped by backend), each backend's hit as a multiple of vLLM's built-in read, and the
    fleet's profiles per round, before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compiled = results.get("compile", {}).get("cases")
    first = [1.1] if compiled else []  # compile artifacts first: a boot-time saving measured here
    fig, axes = plt.subplots(
        1,
        3 + len(first),
        figsize=(17 + 6 * len(first), 7),
        gridspec_kw={"width_ratios": [*first, 1.5, 0.8, 1.1]},
    )
    ax1, ax2, ax3 = axes[-3:]
    if compiled:
        from benchmarks.compile_share import plot_boots

        plot_boots(axes[0], results["compile"])
    labels: list[str] = []
    p50: list[float] = []
    p99: list[float] = []
    ys: list[float] = []
    y = 0.0
    for backend, figures in results["stores"].items():
        ops = [(op, p) for op, p in figures.items() if isinstance(p, dict) and p.get("n")]
        for op, p in ops:
            labels.append(f"{backend}  {op}")
            p50.append(p["p50_us"])
            p99.append(p["p99_us"])
            ys.append(y)
            y += 1
        y += 0.8  # a gap between backends
    ax1.barh([v - 0.2 for v in ys], p50, 0.4, label="p50")
    ax1.barh([v + 0.2 for v in ys], p99, 0.4, label="p99")
    ax1.set_yticks(ys, labels, fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.set_xlabel("microseconds (log)")
    ax1.set_title("store operation latency, by backend (this machine)")
    ax1.legend(loc="lower right")

    ratios = hit_ratios(results)
    if ratios:
        names = list(ratios)
        ax2.bar(names, [ratios[n] for n in names], color="tab:purple")
        ax2.axhline(1.0, color="black", linewidth=0.8)
        for i, n in enumerate(names):
            ax2.text(i, ratios[n], f"{ratios[n]:.1f}x", ha="center", va="bottom")
        ax2.set_yscale("log")
    ax2.set_ylabel("lookup hit p50 / vLLM's built-in read p50 (log)")
    ax2.set_title("hit latency vs vLLM's built-in\n(open + json.load of the same plan)")

    sweep = results.get("fleet_sweep")
    if sweep:
        rounds = range(1, sweep["rounds"] + 1)
        styles = {
            "per-node": ("tab:gray", "s--"),
            "single-point": ("tab:red", "o-"),
            "frontier": ("tab:green", "^-"),
        }
        for name, f in sweep["policies"].items():
            color, style = styles[name]
            label = {
                "per-node": "per-node local plans (vLLM built-in)",
                "single-point": "shared, before: one point per key",
                "frontier": "shared, after: frontier",
            }[name]
            clean = f["seeds_with_no_node_profiling_again"]
            ax3.plot(
                list(rounds),
                f["mean_profiles_per_round"],
                style,
                color=color,
                label=f"{label} ({clean}/{sweep['seeds']} seeds clean)",
            )
        ax3.set_xticks(list(rounds))
        ax3.set_xlabel("round of boots")
        ax3.set_ylabel(f"profiles paid (mean of {sweep['seeds']} seeds, of {sweep['nodes']} nodes)")
        ax3.set_title(
            f"fleet: ±{sweep['free_memory_spread_gib']:.0f} GiB free, "
            f"±{sweep['kv_jitter_mib']:.0f} MiB KV jitter,\nstragglers (simulated time)"
        )
        ax3.legend(
            fontsize=8, title="clean: no node profiles after its first profile", title_fontsize=8
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
