"""Time to proven optimality on the published graphs and the demo models (issue 6's table),
with baseline ratios.

    python -m benchmarks.solver_scale [--time-limit 60] [--long-limit 600] [--rows vgg16 ...]
        [--out results]

For every row: the time limit, the budget in bytes, status (OPTIMAL = proven), the optimal (or best)
cost, the certified gap, the wall time of `solver.solve` (seconds, one run: these are proofs, not
micro-benchmarks) and each baseline's cost relative to that cost ("NO FIT" where it cannot meet the
budget), for every heuristic of `solver.HEURISTICS` (the checkpoint policies, and eviction and the
backward search run at the budget: the solver's warm starts). Checkmate's Table 2 reports AP sqrt(n)
at 1.14-1.54x and greedy at 1.06-1.39x of optimal on these graphs. The demo rows capture the
op-level graphs of graph_capture's demo models (FLOP costs, one thread, so the costs are the same on
every run).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import networkx as nx

import solver
from benchmarks.common import GRAPHS_DIR, Row, write_table
from solver.core.stages import cheapest_within
from solver.heuristics.registry import members
from solver.io import load_graph

PUBLISHED: dict[str, tuple[str, tuple[str, ...]]] = {
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

LONG_ROWS = ("random500", "random1000")
"""Rows solved with --long-limit (issue 6 asks for the certified gap at 600 s there)."""

DEMO_ROWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo-gpt": ("gpt", ("50%",)),
    "demo-resnet": ("resnet", ("50%",)),
    "demo-unet": ("unet", ("50%",)),
}
"""Demo model (`graph_capture.demos`) and budgets."""


def load_row_graph(label: str) -> nx.DiGraph | None:
    """The graph of a row: a published file (None when ../shared/graphs lacks it) or a capture."""
    if label in PUBLISHED:
        path = GRAPHS_DIR / f"{PUBLISHED[label][0]}.json"
        return load_graph(path) if path.exists() else None
    import torch  # only the demo rows need torch

    from graph_capture import capture
    from graph_capture.demos import demo_model

    torch.set_num_threads(1)
    model, inputs = demo_model(DEMO_ROWS[label][0])()
    return capture(model, inputs, cost_model="flops").dag


def solve_row(label: str, graph: nx.DiGraph, budget_text: str, time_limit: float) -> Row:
    """Solve one (graph, budget) and compare every baseline with the result."""
    problem = solver.prepare(graph)
    start = time.perf_counter()
    row: Row = {"graph": label, "nodes": problem.n, "budget": budget_text, "limit": time_limit}
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
        least = exc.minimum_bytes or f">= {exc.lower_bound_bytes} (not proven)"
        row.update(
            status="INFEASIBLE",
            seconds=round(time.perf_counter() - start, 2),
            note=f"least feasible peak {least} B",
        )
        return row
    except solver.SolverTimeoutError:
        row.update(
            status="NO SCHEDULE",
            seconds=round(time.perf_counter() - start, 2),
            note="no heuristic fits and the solver found none in time",
        )
        return row
    row.update(
        budget_bytes=budget,
        status=schedule.status,
        cost=_whole(schedule.cost),
        bound=_whole(schedule.bound),
        gap=schedule.gap,
        seconds=round(time.perf_counter() - start, 2),
    )
    for name, family in members(problem, budget).items():
        best = cheapest_within(family, budget)
        row[name] = "NO FIT" if best is None else round(best.schedule.cost / schedule.cost, 4)
    return row


def _whole(value: float | None) -> float | int | None:
    """Whole costs as ints, so that tables print every digit of an optimum."""
    return round(value) if value is not None and value == round(value) else value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    parser.add_argument(
        "--long-limit", type=float, default=600.0, help=f"seconds per solve of {LONG_ROWS}"
    )
    parser.add_argument("--rows", nargs="*", choices=[*PUBLISHED, *DEMO_ROWS], help="default: all")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = []
    for label in args.rows or [*PUBLISHED, *DEMO_ROWS]:
        graph = load_row_graph(label)
        if graph is None:
            print(f"skip {label}: {PUBLISHED[label][0]}.json not in {GRAPHS_DIR}")
            continue
        for budget in {**PUBLISHED, **DEMO_ROWS}[label][1]:
            limit = args.long_limit if label in LONG_ROWS else args.time_limit
            rows.append(solve_row(label, graph, budget, limit))
            print(rows[-1], flush=True)
    path = write_table(rows, args.out, "solver_scale", "Time to proven optimality")
    print(path.read_text())


if __name__ == "__main__":
    main()
