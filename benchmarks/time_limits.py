"""Time-limit adherence: the wall time of `solver.solve` against its time limit.

    python -m benchmarks.time_limits [--time-limit 10] [--budgets 80% 40% 2%]
        [--graphs FILE.json ...] [--out results]

For each graph and budget, one solve in a fresh process (so that nothing a previous solve left
behind counts): its wall time, the time limit, whether it ended within the promise of
`solver.solve` (time_limit * 1.05 + 0.5 s), and its outcome: status, cost and gap,
"INFEASIBLE" (with the least feasible peak found) or "NO SCHEDULE". By default the graphs are
random_layered n=500 and n=1000 of ../shared/graphs; op-level graphs of real models can be
saved with `python -m benchmarks.capture_graphs` (the zoo) or `remat profile --model ...
--save-graph FILE.json` and passed with --graphs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import GRAPHS_DIR, Row, write_table

DEFAULT_GRAPHS = (
    "random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json",
    "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json",
)
"""Graph files of ../shared/graphs solved by default."""

SLACK_SHARE, SLACK_SECONDS = 0.05, 0.5
"""`solver.solve` returns within time_limit * (1 + SLACK_SHARE) + SLACK_SECONDS."""


def solve_once(path: str, budget: str, time_limit: float) -> Row:
    """One solve of the graph file at `budget`, timed from the loaded graph to the result."""
    import solver
    from solver.io import load_graph

    graph = load_graph(path)
    started = time.perf_counter()
    row: Row = {"graph": Path(path).stem[:32], "nodes": graph.number_of_nodes(), "budget": budget}
    try:
        schedule = solver.solve(graph, budget, time_limit=time_limit)
        outcome = f"{schedule.status} cost {schedule.cost:.6g} gap {100 * (schedule.gap or 0):.2f}%"
    except solver.InfeasibleBudgetError as exc:
        outcome = f"INFEASIBLE (least peak {exc.minimum_bytes or 'not proven'})"
    except solver.SolverTimeoutError:
        outcome = "NO SCHEDULE"
    seconds = time.perf_counter() - started
    within = seconds <= time_limit * (1 + SLACK_SHARE) + SLACK_SECONDS
    return {
        **row,
        "limit": time_limit,
        "wall_s": round(seconds, 2),
        "within": within,
        "outcome": outcome,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    parser.add_argument("--budgets", nargs="+", default=["80%", "40%", "2%"])
    parser.add_argument("--graphs", nargs="+", default=None, help="node-link graph files")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument(
        "--one", nargs=3, metavar=("GRAPH", "BUDGET", "LIMIT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(solve_once(args.one[0], args.one[1], float(args.one[2]))))
        return
    graphs = args.graphs or [str(GRAPHS_DIR / name) for name in DEFAULT_GRAPHS]
    rows = []
    for path in graphs:
        for budget in args.budgets:
            command = [sys.executable, "-m", "benchmarks.time_limits", "--one", path, budget]
            done = subprocess.run([*command, str(args.time_limit)], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{path} at {budget} failed:\n{done.stderr}")
            rows.append(json.loads(done.stdout.splitlines()[-1]))
            print(rows[-1], flush=True)
    out = write_table(rows, args.out, "time_limits", "Wall time against the time limit")
    print(out.read_text())


if __name__ == "__main__":
    main()
