"""`remat fit`: the largest batch or sequence length whose training step fits a memory.

    remat fit --model mypkg.models:make [--budget 24GiB] --dim batch [--compute-budget 1.3x]
              [--optimizer adamw|sgd|none] [--time-limit 60] [--low N] [--high N] [--no-run]
              [--target NAME|FILE [--world-size N [--param-dtype D] [--reduce-dtype D]
              [--master-dtype D] [--no-reshard-after-forward]]] [--offload LINK]

``--model MODULE:FACTORY`` names a function of the size returning ``(model, example_inputs[,
example_kwargs])``; ``--budget`` is needed without ``--target`` (with it, the default is what
the target lets PyTorch allocate: `solver.target.Device.usable`); ``--memory`` and
``--max-overhead`` are read as ``--budget`` and ``--compute-budget`` (`executor.fit`'s
``budget`` and ``compute_budget``); the step's loss is `executor.default_loss` of the output.
Prints
`executor.Fit.summary`: the size, the proof at size + 1, what exists before the step, the
schedule, one real step's measured peak under remat's executor, and eager's and per-block
checkpointing's largest sizes (per rank under FSDP2 with ``--world-size``, estimate mode only:
docs/fit.md; with ``--offload``, the schedules may also copy values to host memory over the link,
spelled as for ``remat solve --offload``, and the host bytes at the answer are printed), with
notes (what the time limit or Ctrl-C left open or undone) and warnings (an eager step that
contradicts the proof). `--time-limit` bounds the whole command, counted from its start (imports
included); the first Ctrl-C ends it with what is known, a second aborts. Exit status 0 where a
size fits and its real step (where run) measured within the memory, 1 where no size fits, the
step measured over or a warning contradicts the proof, 2 on bad input (one line on stderr)."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from cli.profile import add_target_argument
from cli.solve import parse_link
from executor.fitting.api import fit
from executor.fitting.memory import FSDP_OPTIMIZERS, OPTIMIZERS
from executor.fsdp import FsdpPolicy, fsdp_policy
from graph_capture.models.factories import import_factory
from solver.errors import ArgumentError

__all__ = ["add_fit_arguments", "run_fit"]


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="MODULE:FACTORY, a function of the size returning (model, example_inputs"
        "[, example_kwargs]); the loss is the output's .loss, or the output where it is a "
        "scalar",
    )
    parser.add_argument(
        "--budget",
        "--memory",
        help="the memory the step may use: bytes or 24GiB (default with --target: what the "
        "target lets PyTorch allocate, its capacity less the process's memory outside PyTorch, "
        "NCCL's included under --world-size)",
    )
    parser.add_argument("--dim", choices=("batch", "seq"), default="batch")
    parser.add_argument(
        "--compute-budget",
        "--max-overhead",
        help="compute cap, a multiple of computing every node once (1.3x); default: unlimited",
    )
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="seconds for the whole fit: captures, search and real steps",
    )
    parser.add_argument("--low", type=int, default=1, help="the smallest size to try")
    add_target_argument(parser)
    parser.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="FSDP2 ranks (needs --target): the size is each rank's, bytes per rank",
    )
    for name in ("param", "reduce", "master"):
        parser.add_argument(
            f"--{name}-dtype",
            help=f"FSDP2's {name} dtype (default: "
            + {
                "param": "the model's parameters' dtype where no other FSDP option is given, "
                "else the master dtype",
                "reduce": "the param dtype",
            }.get(name, "float32")
            + ")",
        )
    parser.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="FSDP2 keeps each block's parameters unsharded from its forward to its backward",
    )
    parser.add_argument("--high", type=int, help="the largest size to try")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads for captures and runs"
    )
    parser.add_argument(
        "--offload",
        metavar="LINK",
        help="the schedules may also offload values to host memory and back over LINK: "
        "pcie5, pcie4, c2c, a target's (h100), or D2H,H2D[,HOST] in GB/s and host bytes "
        "(docs/offload.md)",
    )
    parser.add_argument(
        "--no-run",
        dest="run",
        action="store_false",
        help="skip the real steps (the answer's own and eager's)",
    )


def run_fit(args: argparse.Namespace) -> int:
    """Fit, print the summary; the exit status (module docstring)."""
    if args.threads < 1:
        raise ArgumentError(f"--threads must be at least 1, not {args.threads}")
    if args.low < 1 or (args.high is not None and args.high < args.low):
        raise ArgumentError(f"sizes must satisfy 1 <= --low <= --high, not {args.low}, {args.high}")
    link = None if args.offload is None else parse_link(args.offload)
    factory = import_factory(args.model)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        found = fit(
            factory,
            args.budget,
            dim=args.dim,
            compute_budget=args.compute_budget,
            optimizer=args.optimizer,
            time_limit=max(args.time_limit - (time.perf_counter() - args.began), 1e-3),
            low=args.low,
            high=args.high,
            run=args.run,
            on_interrupt=_print_interrupted,
            target=args.target,
            world_size=args.world_size,
            fsdp=_fsdp_policy(args),
            offload=link,
        )
    finally:
        torch.set_num_threads(threads)
    print(found.summary())
    over = found.measured_peak is not None and found.measured_peak > found.memory
    return 1 if over or found.size is None or found.warnings else 0


def _fsdp_policy(args: argparse.Namespace) -> FsdpPolicy | None:
    """The FSDP policy the command line sets (`executor.fsdp_policy` for the target with the
    fields given); None where it sets none: fit's default for the model."""
    fields: dict[str, object] = {
        f"{name}_dtype": getattr(args, f"{name}_dtype")
        for name in ("param", "reduce", "master")
        if getattr(args, f"{name}_dtype") is not None
    }
    if not args.reshard_after_forward:
        fields["reshard_after_forward"] = False
    if not fields:
        return None
    if args.world_size < 2:
        raise ArgumentError(
            f"FSDP options ({', '.join(sorted(fields))}) apply only with --world-size above 1"
        )
    optimizer = FSDP_OPTIMIZERS[args.optimizer]
    return fsdp_policy(args.world_size, args.target, optimizer=optimizer, **fields)


def _print_interrupted() -> None:
    print("  interrupted: returning what is known (Ctrl-C again to abort)", file=sys.stderr)
