"""The `remat` command: assembles the subcommands of the three packages.

remat solve GRAPH.json | --demo [NAME]   exact schedule vs baselines (solver.cli)
remat run --demo gpt | --model M:F --budget 50%   train under the schedule, measured
                                                  (executor.run_command)
"""

from __future__ import annotations

import argparse
import sys

import networkx as nx

from executor.run_command import add_run_arguments, run_run
from graph_capture.cli import (
    add_model_arguments,
    add_profile_arguments,
    graph_from_args,
    run_profile,
    wants_model,
)
from graph_capture.errors import CaptureError
from solver.cli import add_solve_arguments, run_solve
from solver.errors import RematError
from solver.examples import DEMOS
from solver.io import load_graph


def _add_graph_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "graph",
        nargs="?",
        help="node-link JSON graph file (e.g. a Checkmate graph from ../shared/graphs)",
    )
    parser.add_argument(
        "--demo",
        nargs="?",
        const="residual",
        default=None,
        metavar="NAME",
        help=f"a built-in example instead of a file: {', '.join(DEMOS)} (default residual), "
        "or a PyTorch demo model to capture: gpt, resnet, unet",
    )


def _graph_from_args(args: argparse.Namespace) -> nx.DiGraph:
    if wants_model(args):
        return graph_from_args(args)
    if args.graph and args.demo:
        raise RematError("give either a graph file or --demo, not both")
    if args.graph:
        return load_graph(args.graph)
    if args.demo in DEMOS:
        return DEMOS[args.demo]()
    raise RematError(
        f"unknown demo {args.demo!r}; choose from {', '.join(DEMOS)}"
        if args.demo
        else "give a graph file (remat solve GRAPH.json) or --demo"
    )


def _solve(args: argparse.Namespace) -> int:
    return run_solve(args, _graph_from_args(args))


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `remat` with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="remat", description="Exact optimal activation-checkpointing schedules."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser("solve", help="solve the optimal schedule for a budget")
    _add_graph_source(solve)
    add_solve_arguments(solve)
    add_model_arguments(solve, demo=False)
    solve.set_defaults(handler=_solve)
    profile = sub.add_parser("profile", help="per-module activation bytes and FLOPs of a model")
    add_profile_arguments(profile)
    profile.set_defaults(handler=run_profile)
    run = sub.add_parser(
        "run", help="train a demo or your model under a schedule; measured vs eager"
    )
    add_run_arguments(run)
    run.set_defaults(handler=run_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `remat` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (RematError, CaptureError, ValueError) as exc:
        print(f"remat: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
