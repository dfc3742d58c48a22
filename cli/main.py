"""The `remat` command: every subcommand, assembled here from the three packages.

remat solve GRAPH.json | --demo [NAME] | --model M:F   exact schedule vs heuristics (cli.solve)
remat profile --demo gpt | --model M:F                  where the activation bytes are
                                                        (cli.profile)
remat run --demo gpt | --model M:F --budget 50%         train under the schedule, measured
                                                        (cli.run)
remat fit --model M:F --budget 24GiB --dim batch        the largest size that fits, proven
                                                        and run (cli.fit)
remat sac --model M:F --budget 50% [--out plan.json]    a SAC plan inside torch's checkpoint,
                                                        run against eager (cli.sac)
remat calibrate --model M:F --out device.json           this device's measured op table for
                                                        --target FILE (cli.calibrate)

Every failure a user can cause (a malformed file, an impossible budget, a bad option) ends in
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cli.calibrate import add_calibrate_arguments, run_calibrate
from cli.estimate import add_estimate_arguments, run_estimate
from cli.fit import add_fit_arguments, run_fit
from cli.profile import (
    add_graph_arguments,
    add_profile_arguments,
    graph_from_args,
    run_profile,
)
from cli.run import add_run_arguments, run_run
from cli.sac import add_sac_arguments, run_sac
from cli.solve import add_solve_arguments, run_solve
from solver.deadline import process_start
from solver.errors import ArgumentError, RematError


@dataclass(frozen=True)
class Subcommand:
    """A `remat` subcommand: its name, one-line help, its arguments and its handler (which
    returns the exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _add_solve(parser: argparse.ArgumentParser) -> None:
    add_graph_arguments(parser)
    add_solve_arguments(parser)


def _solve(args: argparse.Namespace) -> int:
    """`remat solve`: the time limit counts from the command's start for a graph file (imports
    and loading included) and from the end of the capture for a captured model."""
    graph = graph_from_args(args)
    return run_solve(args, graph, args.began if args.graph else None)


SUBCOMMANDS = (
    Subcommand("solve", "solve the optimal schedule for a budget", _add_solve, _solve),
    Subcommand(
        "profile",
        "per-module activation bytes and FLOPs of a model",
        add_profile_arguments,
        run_profile,
    ),
    Subcommand(
        "run",
        "train a demo or your model under a schedule; measured vs eager",
        add_run_arguments,
        run_run,
    ),
    Subcommand(
        "fit",
        "the largest batch or sequence length whose training step fits a memory",
        add_fit_arguments,
        run_fit,
    ),
    Subcommand(
        "sac",
        "solve a selective-checkpoint plan for torch.utils.checkpoint; measured vs eager",
        add_sac_arguments,
        run_sac,
    ),
    Subcommand(
        "estimate",
        "will a training step fit, and how fast: every checkpointing strategy side by side",
        add_estimate_arguments,
        run_estimate,
    ),
    Subcommand(
        "calibrate",
        "measure this device's op seconds and host link into a device file for --target FILE",
        add_calibrate_arguments,
        run_calibrate,
    ),
)
"""Every subcommand of `remat`, in the order `remat --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `remat` with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="remat", description="Exact optimal activation-checkpointing schedules."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        subparser = sub.add_parser(command.name, help=command.help)
        command.add_arguments(subparser)
        subparser.set_defaults(handler=command.run)
    return parser


OUTPUT_FLAGS = {"out": "--out", "save_graph": "--save-graph", "plot": "--plot"}
"""The options that name a file a subcommand writes when it is done."""


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any capture or solve, a file to write in a directory that does not exist
    or cannot be written: found only at the end, it would cost the whole solve."""
    for attribute, flag in OUTPUT_FLAGS.items():
        path = getattr(args, attribute, None)
        if not path:
            continue
        directory = Path(path).resolve().parent
        if not directory.is_dir():
            raise ArgumentError(f"cannot write {flag} {path}: no directory {directory}")
        if not os.access(directory, os.W_OK):
            raise ArgumentError(
                f"cannot write {flag} {path}: directory {directory} is not writable"
            )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `remat` console script; returns the exit status. Run as the command
    (`argv` None), time limits count from the process's start (`process_start`: the imports
    take seconds); called with `argv`, from the call."""
    started = process_start() if argv is None else None
    args = build_parser().parse_args(argv)
    args.began = time.perf_counter() if started is None else started
    try:
        _check_outputs(args)
        return args.handler(args)
    except (RematError, ValueError, OSError) as exc:
        message = "; ".join(line for line in str(exc).splitlines() if line.strip())
        print(f"remat: error: {message or type(exc).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("remat: interrupted: aborted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
