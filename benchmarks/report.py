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
    imp = results["import"]
    lines.append(
        f"import plancache: +{imp['added_ms']:.1f} ms over a bare interpreter "
        f"({imp['bare_interpreter_ms']:.1f} ms); heavy modules loaded: "
        f"{', '.join(imp['heavy_modules_loaded']) or 'none'}"
    )
    lines.append("")
    lines.append(f"{'store latency (us)':34s} {'p50 / p99':>21s}  requests")
    for backend, figures in results["stores"].items():
        for op, p in figures.items():
            if isinstance(p, dict) and "p50_us" in p:
                req = figures.get("requests", {}).get(op, "")
                lines.append(f"  {backend + ' ' + op:32s} {_us(p):>21s}  {req}")
    fleet = results.get("fleet")
    if fleet:
        lines.append("")
        lines.append(
            f"fleet (SIMULATED profiling {fleet['profile_seconds_simulated']} s, "
            f"{fleet['nodes']} nodes, {fleet['configs']} configs, {fleet['rounds']} rounds)"
        )
        lines.append(
            f"  {'set-up':10s} {'profiles':>8s} {'per round':>12s} {'saved (s)':>10s} "
            f"{'lookup p50/p99 (us)':>22s} {'valid':>6s}"
        )
        for name, f in fleet["setups"].items():
            lines.append(
                f"  {name:10s} {f['profiles_paid']:8d} {f['profiles_paid_per_round']!s:>12s} "
                f"{f['simulated_seconds_saved']:10.1f} {_us(f['lookup']):>22s} "
                f"{f['nodes_with_valid_plan']:3d}/{fleet['nodes']}"
            )
    lines.append("")
    lines.append(f"real boot: {results['boot']}")
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))


def plot(results: dict[str, Any], path: Path) -> None:
    """Latency per backend and operation; fleet profiles paid and simulated time saved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    labels, p50, p99 = [], [], []
    for backend, figures in results["stores"].items():
        for op, p in figures.items():
            if isinstance(p, dict) and p.get("n"):
                labels.append(f"{backend}\n{op}")
                p50.append(p["p50_us"])
                p99.append(p["p99_us"])
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
    ax1.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
    ax1.set_xticks(list(xs), labels, rotation=75, fontsize=7)
    ax1.set_yscale("log")
    ax1.set_ylabel("microseconds (log)")
    ax1.set_title("store operation latency (this machine)")
    ax1.legend()
    fleet = results.get("fleet")
    if fleet:
        names = list(fleet["setups"])
        paid = [fleet["setups"][n]["profiles_paid"] for n in names]
        saved = [fleet["setups"][n]["simulated_seconds_saved"] for n in names]
        ax2.bar(names, paid, color="tab:red", label="profiles paid")
        ax2.set_ylabel("profiles paid")
        twin = ax2.twinx()
        twin.plot(names, saved, "o-", color="tab:green", label="seconds saved (simulated)")
        twin.set_ylabel("simulated seconds saved")
        ax2.set_title(
            f"fleet: {fleet['nodes']} nodes x {fleet['rounds']} rounds, "
            f"profiling {fleet['profile_seconds_simulated']} s (simulated)"
        )
        ax2.legend(loc="upper left")
        twin.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
