"""Time-limit adherence: the wall time of `solver.solve` against its time limit.

    python -m benchmarks.solving.time_limits [--time-limit 10] [--budgets 80% 40% 2%]
        [--graphs FILE.json ...] [--cli] [--offload LINK] [--out results]

For each graph and budget, one solve in a fresh process (so that nothing a previous solve left
behind counts): its wall time, the time limit, whether it ended within the promise of
`solver.solve` (time_limit * 1.05 + 0.5 s), and its outcome: status, cost and gap,
"INFEASIBLE" (with the least feasible peak found) or "NO SCHEDULE". By default the graphs are
random_layered n=500 and n=1000 of ../shared/graphs; op-level graphs of real models can be
saved with `python -m benchmarks.running.capture_graphs` (the zoo) or `remat profile --model ...
--save-graph FILE.json` and passed with --graphs. With --cli, the whole `remat solve` command
instead (the exact solve and the table of heuristics, from the graph file to the last row), held
to the same promise; its outcome is the table's exact row. With --offload (a link or target name,
`pcie5`, `h100`), the solve with offload over that link (`solver.solve(..., offload=LINK)`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
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


def solve_once(
    path: str, budget: str, time_limit: float, cli: bool = False, offload: str | None = None
) -> Row:
    """One solve of the graph file at `budget`, timed from the loaded graph to the result (with
    `cli`: `remat solve`, timed from the call, the graph's loading and the table included, its
    imports not: torch's alone took 5-40 s on a loaded 2-core machine)."""
    from cli.main import main  # noqa: F401  (imported here, not in the timed call)
    from solver.io import load_graph

    graph = load_graph(path)
    row: Row = {"graph": Path(path).stem[:32], "nodes": graph.number_of_nodes(), "budget": budget}
    started = time.perf_counter()
    if cli:
        outcome = _command_outcome(path, budget, time_limit, offload)
    else:
        outcome = _solve_outcome(graph, budget, time_limit, offload)
    seconds = time.perf_counter() - started
    within = seconds <= time_limit * (1 + SLACK_SHARE) + SLACK_SECONDS
    return {**row, "limit": time_limit, "wall_s": round(seconds, 2), "within": within, **outcome}


def _solve_outcome(graph, budget: str, time_limit: float, offload: str | None) -> Row:
    """`solver.solve`'s status, cost and gap, "INFEASIBLE" (with the least feasible peak found)
    or "NO SCHEDULE"."""
    import solver

    try:
        schedule = solver.solve(graph, budget, time_limit=time_limit, offload=offload)
        outcome = f"{schedule.status} cost {schedule.cost:.6g} gap {100 * (schedule.gap or 0):.2f}%"
    except solver.InfeasibleBudgetError as exc:
        outcome = f"INFEASIBLE (least peak {exc.minimum_bytes or 'not proven'})"
    except solver.SolverTimeoutError:
        outcome = "NO SCHEDULE"
    return {"outcome": outcome}


def _command_outcome(path: str, budget: str, time_limit: float, offload: str | None) -> Row:
    """`remat solve` on the graph file (progress off): its exit status and exact row (with
    `offload`, its "exact + offload" row), and how many heuristic rows the time limit cut short
    ("TIME")."""
    from cli.main import main as remat

    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        command = ["solve", path, "--budget", budget, "--time-limit", str(time_limit), "--quiet"]
        status = remat(command + ([] if offload is None else ["--offload", offload]))
    lines = table.getvalue().splitlines()
    row = "exact" if offload is None else "exact + offload"
    exact = next((line[len(row) :].strip() for line in lines if line.startswith(row + " ")), "-")
    cut = sum(" TIME " in line for line in lines)
    return {"exit": status, "outcome": exact, "rows_cut": cut}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    parser.add_argument("--budgets", nargs="+", default=["80%", "40%", "2%"])
    parser.add_argument("--graphs", nargs="+", default=None, help="node-link graph files")
    parser.add_argument("--cli", action="store_true", help="time `remat solve`, table included")
    parser.add_argument("--offload", default=None, help="solve with offload over this link")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument(
        "--one", nargs=3, metavar=("GRAPH", "BUDGET", "LIMIT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.one:
        row = solve_once(args.one[0], args.one[1], float(args.one[2]), args.cli, args.offload)
        print(json.dumps(row))
        return
    graphs = args.graphs or [str(GRAPHS_DIR / name) for name in DEFAULT_GRAPHS]
    rows = []
    for path in graphs:
        for budget in args.budgets:
            command = [
                sys.executable,
                "-m",
                "benchmarks.solving.time_limits",
                "--one",
                path,
                budget,
            ]
            command += [str(args.time_limit), *(["--cli"] if args.cli else [])]
            command += [] if args.offload is None else ["--offload", args.offload]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{path} at {budget} failed:\n{done.stderr}")
            rows.append(json.loads(done.stdout.splitlines()[-1]))
            print(rows[-1], flush=True)
    name, title = ("time_limits_cli", "`remat solve`") if args.cli else ("time_limits", "solve")
    out = write_table(rows, args.out, name, f"Wall time of {title} against the time limit")
    print(out.read_text())


if __name__ == "__main__":
    main()
