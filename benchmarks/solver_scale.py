"""Time to proven optimality on the published graphs (issue 6's table), with baseline ratios.

    python -m benchmarks.solver_scale [--time-limit 60] [--rows vgg16 resnet50 ...] [--out results]

For every row: the budget in bytes, status (OPTIMAL = proven), the optimal (or best) cost, the
certified gap, the wall time of `solver.solve` (seconds, one run: these are proofs, not
micro-benchmarks) and each baseline's cost relative to that cost ("NO FIT" where it cannot
meet the budget). Checkmate's Table 2 reports AP sqrt(n) at 1.14-1.54x and greedy at 1.06-1.39x
of optimal on these graphs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import solver
from benchmarks.common import GRAPHS_DIR, Row, write_table
from solver.baselines import BASELINES, cheapest_within
from solver.io import load_graph

ROWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "vgg16": ("VGG16_256_224x224x3_train_nx", ("90%", "80%", "70%", "min")),
    "vgg19": ("VGG19_256_224x224x3_train_nx", ("90%", "80%", "70%", "min")),
    "fcn8": ("fcn_8_vgg_32_416x608x3_train_nx", ("90%", "80%")),
    "mobilenet": ("MobileNet_512_224x224x3_train_nx", ("90%", "80%")),
    "resnet50": ("ResNet50_256_224x224x3_train_nx", ("90%", "80%")),
    "random250": ("random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14", ("90%", "80%")),
    "random500": ("random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14", ("90%",)),
    "random1000": ("random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14", ("90%",)),
}
"""Issue 6's table: graph file stem and budgets ("min" = the least feasible peak)."""


def solve_row(label: str, stem: str, budget_text: str, time_limit: float) -> Row:
    """Solve one (graph, budget) and compare every baseline with the result."""
    graph = load_graph(GRAPHS_DIR / f"{stem}.json")
    problem = solver.prepare(graph)
    start = time.perf_counter()
    row: Row = {"graph": label, "nodes": problem.n, "budget": budget_text}
    try:
        if budget_text == "min":
            least = solver.minimum_peak(graph, time_limit=time_limit)
            budget = least.peak
            row["least peak proven"] = least.status == "OPTIMAL"
            schedule = solver.solve(graph, budget, time_limit=time_limit)
        else:
            budget = solver.parse_budget(budget_text, problem)
            schedule = solver.solve(graph, budget, time_limit=time_limit)
    except solver.InfeasibleBudgetError as exc:
        row.update(
            status="INFEASIBLE",
            seconds=round(time.perf_counter() - start, 2),
            note=f"least feasible peak {exc.minimum_bytes} B",
        )
        return row
    row.update(
        budget_bytes=budget,
        status=schedule.status,
        cost=schedule.cost,
        gap=schedule.gap,
        seconds=round(time.perf_counter() - start, 2),
    )
    for name, family in BASELINES.items():
        best = cheapest_within(family(problem), budget)
        row[name] = "NO FIT" if best is None else round(best.schedule.cost / schedule.cost, 4)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    parser.add_argument("--rows", nargs="*", choices=list(ROWS), help="default: all")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = []
    for label in args.rows or list(ROWS):
        stem, budgets = ROWS[label]
        if not (GRAPHS_DIR / f"{stem}.json").exists():
            print(f"skip {label}: {GRAPHS_DIR / stem}.json not present")
            continue
        for budget in budgets:
            rows.append(solve_row(label, stem, budget, args.time_limit))
            print(rows[-1], flush=True)
    path = write_table(rows, args.out, "solver_scale", "Time to proven optimality")
    print(path.read_text())


if __name__ == "__main__":
    main()
