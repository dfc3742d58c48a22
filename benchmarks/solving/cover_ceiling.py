"""The ceiling of the cascade cover's bound: its 0/1 optimum with every row at once.

    python -m benchmarks.solving.cover_ceiling GRAPH.json [GRAPH.json ...] --budgets 6422332
        least+10%
        [--time-limit 120] [--least-time-limit 60] [--out results]

`solver.exact.cascade` raises the floor by row generation on the cascade cover
(`solver.milp.cascade_rounds.cascade_bound`); no engine can take it above the cover's own 0/1
optimum with every row (every stage over the budget in checkpoint-all). For each graph and
budget (bytes, a share such as "50%", or "least+10%": the least peak `solver.solve` (objective
"memory") finds in `--least-time-limit` seconds plus 10%), this builds that model, solves it with
HiGHS's branch and cut (the solver's settings, `solver.milp.highs_mip`) within the time limit, and
reports its certified bound and best solution, as recomputation over the node costs (the cost of
computing every node once). Where it is proven, a solve that ends there
(`benchmarks.solving.time_limits --one`) has a bound only a stronger model can raise
(docs/solver.md, "Least + 10%"). One run each, on whatever the machine is doing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import solver
from benchmarks.common import Row, write_table
from benchmarks.solving.zoo_budgets import least_peak_plus
from solver.deadline import Deadline
from solver.io import load_graph
from solver.milp.cascade import Crossings, cascade_model
from solver.milp.highs_mip import HighsMip
from solver.milp.units import CostUnits


def ceiling_row(path: Path, budget_text: str, time_limit: float, least_time_limit: float) -> Row:
    """One row: the cascade cover of the graph file at the budget with every row, solved by
    HiGHS within `time_limit` seconds; "bound" and "solution" are recomputation over the node
    costs (the solution None where none was found), "proven" whether they meet."""
    graph = load_graph(path)
    problem = solver.prepare(graph)
    if budget_text == "least+10%":
        budget = least_peak_plus(graph, 0.10, least_time_limit)[0]
    else:
        budget = solver.parse_budget(budget_text, problem)
    units = CostUnits.of(problem)
    started = time.perf_counter()
    model = cascade_model(problem, Crossings.of(problem, budget), units.int_cost)
    result = HighsMip(model.lm).solve(
        deadline=Deadline.after(time_limit),
        fixed={},
        objective_cap=sum(model.lm.objective.values()),
    )
    seconds = time.perf_counter() - started
    bound = result.proven(None)
    return {
        "graph": path.stem,
        "budget": budget_text,
        "bytes": budget,
        "rows": len(model.rows),
        "variables": len(model.lm.names),
        "bound": round(bound / units.first, 4),
        "solution": None if result.objective is None else round(result.objective / units.first, 4),
        "proven": result.objective is not None and bound >= result.objective,
        "s": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graphs", nargs="+", type=Path, help="graph files (solver.io format)")
    parser.add_argument("--budgets", nargs="+", default=["least+10%"])
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per model")
    parser.add_argument(
        "--least-time-limit", type=float, default=60.0, help="seconds for the least peak"
    )
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = []
    for path in args.graphs:
        for budget in args.budgets:
            rows.append(ceiling_row(path, budget, args.time_limit, args.least_time_limit))
            print(rows[-1], flush=True)
    out = write_table(rows, args.out, "cover_ceiling", "The cascade cover's 0/1 optimum")
    print(out.read_text())


if __name__ == "__main__":
    main()
