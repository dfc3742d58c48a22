"""Plumbing shared by the benchmarks: the results folder, CSV + markdown tables, PNG plots, and
the predicted frontier of the exact solver against every baseline family (rotor on chains)."""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

import solver
from benchmarks.frontier_points import frontier

Row = dict[str, object]

GRAPHS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "graphs"
"""The published Checkmate graphs (`../shared/graphs` from the repository); may be absent."""


@dataclass(frozen=True)
class Settings:
    """One benchmark run: where results go, how long exact solves may take (seconds), how many
    repeats timing medians use, and whether this is the quick (CI smoke) variant."""

    out: Path
    quick: bool = False
    time_limit: float = 20.0
    repeats: int = 5
    workers: int = 8


def write_table(rows: Sequence[Row], out: Path, stem: str, title: str) -> Path:
    """Write `rows` as `stem.csv` and `stem.md` (a titled markdown table) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def exact_row(graph: nx.DiGraph, budget: int, settings: Settings) -> tuple[Row, object]:
    """The exact solver at `budget` bytes: a row (cost, peak, status, gap, seconds) and the
    schedule (None when infeasible or timed out)."""
    start = time.perf_counter()
    try:
        s = solver.solve(graph, budget, time_limit=settings.time_limit, workers=settings.workers)
    except solver.InfeasibleBudgetError:
        return {"status": "INFEASIBLE"}, None
    except solver.SolverTimeoutError:
        return {"status": "TIMEOUT"}, None
    seconds = time.perf_counter() - start
    return {"cost": s.cost, "peak": s.peak, "status": s.status, "gap": s.gap, "s": seconds}, s


def predicted_frontier(
    graph: nx.DiGraph, fractions: Sequence[float], settings: Settings, label: str
) -> list[Row]:
    """`benchmarks.frontier_points.frontier` at each budget (a fraction of the checkpoint-all
    peak) as rows: overhead = cost / the checkpoint-all cost - 1; peak_frac = peak /
    checkpoint-all peak."""
    problem = solver.prepare(graph)
    full_peak, total = solver.checkpoint_all_peak(problem), problem.total_cost
    fraction_of = {int(full_peak * fraction): fraction for fraction in fractions}
    points = frontier(
        graph, list(fraction_of), time_limit=settings.time_limit, workers=settings.workers
    )
    return [
        {
            "graph": label,
            "budget_frac": round(fraction_of[p.budget], 4),
            "method": p.method,
            "overhead": None if p.cost is None else p.cost / total - 1,
            "peak_frac": None if p.cost is None else p.peak / full_peak,
            "status": p.status,
            "gap": p.gap,
            "solve_s": p.seconds if p.method == "exact" else None,
        }
        for p in points
    ]


def budget_ladder(low: float, points: int) -> list[float]:
    """`points` budget fractions from 1.0 (the checkpoint-all peak) down to `low`."""
    return [1.0 - (1.0 - low) * j / (points - 1) for j in range(points)]


def min_peak_row(graph: nx.DiGraph, settings: Settings, label: str) -> tuple[Row, solver.Schedule]:
    """The exact solver's least-peak schedule (objective "memory", unlimited recomputation):
    the low end of the frontier, as a row (overhead, status, gap of the peak) and itself."""
    problem = solver.prepare(graph)
    s = solver.solve(
        graph, objective="memory", time_limit=settings.time_limit, workers=settings.workers
    )
    frac = s.peak / solver.checkpoint_all_peak(problem)
    row = {
        "graph": label,
        "budget_frac": round(frac, 4),
        "method": "exact min-peak",
        "overhead": s.cost / problem.total_cost - 1,
        "peak_frac": frac,
        "status": s.status,
        "gap": s.gap,
        "solve_s": s.solve_seconds,
    }
    return row, s


def plot_frontier(rows: Sequence[Row], path: Path, title: str) -> Path:
    """Recompute overhead at each budget (fraction of the checkpoint-all peak), one line per
    method over the budgets where it fits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=90)
    methods = list(dict.fromkeys(str(r["method"]) for r in rows))
    for method in methods:
        pts = sorted(
            (float(r["budget_frac"]), float(r["overhead"]))
            for r in rows
            if r["method"] == method and r["overhead"] is not None
        )
        if pts:
            style = {"lw": 2.5, "color": "black"} if method == "exact" else {"lw": 1, "alpha": 0.8}
            if method == "exact min-peak":
                style = {"color": "black", "marker": "*", "markersize": 10, "ls": "none"}
            ax.plot(*zip(*pts, strict=True), label=method, **{"marker": ".", **style})
    ax.set_xlabel("memory budget (fraction of checkpoint-all peak)")
    ax.set_ylabel("recompute overhead (fraction of one step)")
    ax.invert_xaxis()
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def command_line(
    run: Callable[[Settings], object], description: str, argv: list[str] | None = None
) -> None:
    """`python -m benchmarks.<part> [--quick] [--out DIR]`: run one part with the usual settings
    (exact solves limited to 3 s with --quick, else 10 s)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    run(Settings(args.out, quick=args.quick, time_limit=3 if args.quick else 10))
