"""Ablation: each step of the exact search switched off in turn, to see which earns its place.

    python -m benchmarks.solving.ablation [--time-limit 30] [--rows vgg19 mobilenet ...]
        [--budgets 80% ...] [--zoo-dir results/graphs] [--out results]

For every row of `benchmarks.solving.solver_scale` named (published graphs and zoo graph files at
their
budgets; "min" budgets are the least-peak rows), one solve with every step
(`solver.exact.pipeline.COST_STEPS`, or `solver.exact.least_peak.STEPS` for the least-peak rows:
`solver.solve`, objective "memory") and one with each step left out (`SolveOptions(steps=...)`), one
solve at a time. Each cell is "OPTIMAL" or the certified gap (least-peak rows: the least peak's over
its proven floor) and the wall time of the solve; a cell that differs from the full pipeline's by
more than the spread between runs of the same code (the local searches vary with timing: rerun
before reading a small difference) says the step matters on that row.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import networkx as nx

import solver
from benchmarks.common import Row, write_table
from benchmarks.solving.solver_scale import PUBLISHED, ZOO_ROWS, load_row_graph, zoo_budget
from solver.exact import least_peak
from solver.exact.pipeline import COST_STEPS

FULL = "all steps"


def variants(steps: tuple) -> dict[str, tuple]:
    """The full pipeline and, for each step, the pipeline without it, by name."""
    out = {FULL: steps}
    out.update({f"no {s.__name__}": tuple(t for t in steps if t is not s) for s in steps})
    return out


def _cell(schedule: solver.Schedule, seconds: float) -> str:
    """ "OPTIMAL" or the certified gap, then the solve's seconds."""
    proof = "OPTIMAL" if schedule.status == "OPTIMAL" else f"{100 * (schedule.gap or 0):.3f}%"
    return f"{proof} ({seconds:.1f} s)"


def ablate_row(label: str, graph: nx.DiGraph, budget_text: str, time_limit: float) -> Row:
    """One row: the full pipeline's cell and one per step left out."""
    row: Row = {"graph": label, "nodes": graph.number_of_nodes(), "budget": budget_text}
    if budget_text == "min":
        for name, steps in variants(least_peak.STEPS).items():
            began = time.perf_counter()
            options = solver.SolveOptions(steps=steps)
            least = solver.solve(graph, objective="memory", time_limit=time_limit, options=options)
            row[name] = _cell(least, time.perf_counter() - began)
        return row
    if label in ZOO_ROWS:
        budget = zoo_budget(label, graph, budget_text, time_limit)
    else:
        budget = solver.parse_budget(budget_text, solver.prepare(graph))
    for name, steps in variants(COST_STEPS).items():
        began = time.perf_counter()
        try:
            schedule = solver.solve(
                graph, budget, time_limit=time_limit, options=solver.SolveOptions(steps=steps)
            )
            row[name] = _cell(schedule, time.perf_counter() - began)
        except (solver.InfeasibleBudgetError, solver.SolverTimeoutError) as exc:
            row[name] = type(exc).__name__
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per solve")
    every = {**PUBLISHED, **ZOO_ROWS}
    parser.add_argument("--rows", nargs="+", choices=list(every), required=True)
    parser.add_argument("--budgets", nargs="*", help="only these of each row's budgets")
    parser.add_argument("--zoo-dir", type=Path, default=Path("results/graphs"))
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = []
    for label in args.rows:
        graph = load_row_graph(label, args.zoo_dir)
        if graph is None:
            print(
                f"skip {label}: no graph file "
                "(see python -m benchmarks.solving.solver_scale --help)"
            )
            continue
        for budget in every[label][1]:
            if args.budgets and budget not in args.budgets:
                continue
            rows.append(ablate_row(label, graph, budget, args.time_limit))
            print(rows[-1], flush=True)
    title = f"Certified gap (solve seconds) with each step left out, {args.time_limit:g} s"
    print(write_table(rows, args.out, "ablation", title).read_text())


if __name__ == "__main__":
    main()
