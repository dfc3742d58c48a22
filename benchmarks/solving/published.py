"""The published Checkmate graphs (../shared/graphs): exact optimum vs every baseline.

For each training graph and budget (fraction of the checkpoint-all peak): the exact solver's
recompute overhead, status and gap, and each baseline's cost as a ratio to the exact cost
(1.0 = optimal; "NO FIT" where the family has no schedule within the budget). Skipped when the
graphs are absent. Checkmate's Table 2 reports the same kind of baseline/optimum ratios on these
graphs; its numbers are not shipped with this repository, so compare by reading the paper.

Run: python -m benchmarks.solving.published [--quick] [--out results]
"""

from __future__ import annotations

import solver
from benchmarks.common import (
    GRAPHS_DIR,
    Row,
    Settings,
    command_line,
    exact_row,
    plot_frontier,
    predicted_frontier,
    write_table,
)
from solver.core.stages import cheapest_within
from solver.heuristics.registry import members
from solver.io import load_graph

LABELS = {
    "VGG16_256_224x224x3": "VGG16",
    "VGG19_256_224x224x3": "VGG19",
    "fcn_8_vgg_32_416x608x3": "FCN8",
    "MobileNet_512_224x224x3": "MobileNet",
    "vgg_unet_32_416x608x3": "VGG-UNet",
}
"""Graph file stems (without _train_nx.json) and their table labels."""
QUICK = ("VGG16_256_224x224x3", "VGG19_256_224x224x3")
FULL = tuple(LABELS)


def ratio_rows(name: str, settings: Settings, fractions: tuple[float, ...]) -> list[Row]:
    """One row per budget: exact overhead/status/gap and baseline cost / exact cost."""
    graph = load_graph(GRAPHS_DIR / f"{name}_train_nx.json")
    problem = solver.prepare(graph)
    full_peak = solver.checkpoint_all_peak(problem)
    fams = members(problem)
    rows = []
    for fraction in fractions:
        budget = int(full_peak * fraction)
        found, _ = exact_row(graph, budget, settings)
        row: Row = {
            "graph": LABELS[name],
            "nodes": problem.n,
            "budget": f"{fraction:.0%}",
            "exact_overhead": found["cost"] / problem.total_cost - 1 if "cost" in found else None,
            "status": found["status"],
            "gap": found.get("gap"),
            "solve_s": found.get("s"),
        }
        for method, family in fams.items():
            if method == "checkpoint_all":
                continue
            best = cheapest_within(family, budget)
            row[method] = (
                "NO FIT"
                if best is None
                else (best.schedule.cost / found["cost"] if "cost" in found else None)
            )
        rows.append(row)
    return rows


def run(settings: Settings) -> list[Row]:
    """Write published_ratios.* and one frontier plot per graph; returns the ratio rows."""
    if not GRAPHS_DIR.is_dir():
        print(f"published graphs not found at {GRAPHS_DIR}: skipped")
        return []
    names = QUICK if settings.quick else FULL
    fractions = (0.9, 0.8) if settings.quick else (0.9, 0.8, 0.7, 0.6)
    rows = [r for name in names for r in ratio_rows(name, settings, fractions)]
    write_table(rows, settings.out, "published_ratios", "Checkmate graphs: baseline cost / exact")
    if not settings.quick:
        for name in QUICK:
            graph = load_graph(GRAPHS_DIR / f"{name}_train_nx.json")
            ladder = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6]
            frontier = predicted_frontier(graph, ladder, settings, name)
            write_table(frontier, settings.out, f"frontier_{name}", f"{name} frontier")
            plot_frontier(frontier, settings.out / f"frontier_{name}.png", LABELS[name])
    return rows


def main(argv: list[str] | None = None) -> None:
    command_line(run, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
