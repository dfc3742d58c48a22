"""Whether a solve's status and proof depend on the unit its costs are written in.

    python -m benchmarks.solving.cost_scale [--rows vgg19:80% resnet50:90% ...] [--factors 1
        1234.567]
        [--time-limit 60] [--zoo-dir results/graphs] [--out results]

Every row is solved once per factor with every node's cost multiplied by that factor (the same
graph, the same schedules, the same optimum up to the factor): status, recompute cost over the
first-factor solve's (1.000000 when they agree), certified gap, wall seconds of `solver.solve`,
and the step that closed the search (the last one `extra["steps"]` lists). A row is
"name:budget" with name a published graph (`benchmarks.solving.solver_scale.PUBLISHED`) or a zoo
graph
file stem under `--zoo-dir` (`python -m benchmarks.running.capture_graphs` writes them).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import networkx as nx

import solver
from benchmarks.common import GRAPHS_DIR, Row, write_table
from benchmarks.solving.solver_scale import PUBLISHED
from solver.io import load_graph

DEFAULT_ROWS = (
    "vgg16:90%",
    "vgg16:70%",
    "vgg19:80%",
    "vgg19:70%",
    "fcn8:90%",
    "fcn8:80%",
    "mobilenet:90%",
    "mobilenet:80%",
    "resnet50:90%",
    "resnet50:80%",
    "random250:90%",
    "segnet:90%",
)
DEFAULT_FACTORS = (1.0, 1e-3, 1234.567, 1e4)


def scaled(graph: nx.DiGraph, factor: float) -> nx.DiGraph:
    """A copy of `graph` with every node's cost multiplied by `factor`."""
    copy = graph.copy()
    for _, attrs in copy.nodes(data=True):
        attrs["cost"] = attrs["cost"] * factor
    return copy


def graph_file(name: str, zoo_dir: Path) -> Path:
    """The file of a published graph (by `PUBLISHED` key) or of a zoo graph (by file stem)."""
    if name in PUBLISHED:
        return GRAPHS_DIR / f"{PUBLISHED[name][0]}.json"
    return zoo_dir / f"{name}.json"


def solve_row(graph: nx.DiGraph, budget: str, factor: float, time_limit: float) -> Row:
    """One solve of `graph` with costs times `factor`: what it proved and how fast."""
    started = time.perf_counter()
    try:
        schedule = solver.solve(scaled(graph, factor), budget, time_limit=time_limit)
    except solver.InfeasibleBudgetError:  # proven: nothing fits
        seconds = time.perf_counter() - started
        return {
            "factor": factor,
            "status": "INFEASIBLE",
            "cost": math.nan,
            "gap": None,
            "seconds": round(seconds, 2),
            "last_step": "",
        }
    seconds = time.perf_counter() - started
    steps = schedule.extra.get("steps", [])
    return {
        "factor": factor,
        "status": schedule.status,
        "cost": schedule.cost / factor,
        "gap": schedule.gap,
        "seconds": round(seconds, 2),
        "last_step": steps[-1]["step"] if steps else "",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS))
    parser.add_argument("--factors", nargs="+", type=float, default=list(DEFAULT_FACTORS))
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--zoo-dir", type=Path, default=Path("results/graphs"))
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    table: list[Row] = []
    for row in args.rows:
        name, budget = row.split(":")
        path = graph_file(name, args.zoo_dir)
        if not path.exists():
            print(f"{row}: skipped, {path} is missing", flush=True)
            continue
        graph = load_graph(path)
        reference: float | None = None
        for factor in args.factors:
            result = solve_row(graph, budget, factor, args.time_limit)
            cost = float(result.pop("cost"))  # type: ignore[arg-type]
            reference = reference or cost
            result["cost_ratio"] = round(cost / reference, 6)
            table.append({"row": row, **result})
            print(table[-1], flush=True)
    path = write_table(table, args.out, "cost_scale", "Status and proof time by cost scale")
    print(f"written {path}")


if __name__ == "__main__":
    main()
