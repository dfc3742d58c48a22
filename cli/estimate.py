"""`remat estimate`: will a training step fit, and how fast, under every checkpointing
strategy (`executor.estimate`), one table per rank.

    remat estimate --hf-config llama3-8b/config.json --target h100 --world-size 8 --seq 8192
    remat estimate --model mypkg.models:make --target h100 --plot strategies.png

``--hf-config`` builds the causal LM of a local ``config.json`` on the meta device (no
weights, no hub) with ``--batch`` x ``--seq`` token ids as its labels, in ``--dtype``; under
FSDP2 (``--world-size`` > 1) it is gathered in that dtype from float32 master weights and its
gradients reduced in float32 (torchtitan's defaults). ``--model`` is a factory as for
`remat sac` (``(model, example_inputs[, example_kwargs])``). Without ``--target`` the step is
recorded here (measured). ``--largest batch seq`` (with ``--hf-config``) adds each row's largest
local batch at ``--seq`` and largest sequence at ``--batch`` (in multiples of
``min(1024, --seq)`` tokens), one estimate per size. Exit status 0 when some strategy fits, 1
when none does."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from cli.profile import load_model_from_args
from cli.solve import parse_link
from executor.estimation import estimate
from executor.estimation.hf_config import DTYPES, model_from_config
from executor.fsdp import fsdp_policy
from executor.sac.planning import REGIONS
from solver.errors import ArgumentError

__all__ = ["add_estimate_arguments", "run_estimate"]

LARGEST = ("batch", "seq")
"""The dimensions ``--largest`` searches."""


def _factories(args: argparse.Namespace) -> dict[str, Callable[[int], object]]:
    """``--largest``'s factories: the ``--hf-config`` model at a batch of n rows (at
    ``--seq``), or at a sequence of n units of ``min(1024, --seq)`` tokens (at ``--batch``),
    keyed by the column name."""
    if args.largest and not args.hf_config:
        raise ArgumentError(
            "--largest builds the model at other sizes from --hf-config; for a --model "
            "factory call executor.estimate(..., factories={'batch': f}) from Python"
        )
    unit = min(1024, args.seq)
    made = {
        "batch": lambda n: model_from_config(args.hf_config, n, args.seq, args.dtype),
        f"seq (x{unit:,} tokens)": lambda n: model_from_config(
            args.hf_config, args.batch, n * unit, args.dtype
        ),
    }
    return {k: f for k, f in made.items() if k.split()[0] in args.largest}


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--model", metavar="MODULE:FACTORY", help="a callable returning (model, inputs[, kwargs])"
    )
    model.add_argument("--hf-config", metavar="PATH", help="a local Hugging Face config.json")
    parser.add_argument("--target", metavar="NAME|FILE", help="the device (default: here)")
    parser.add_argument("--world-size", type=int, default=1, help="FSDP2 ranks (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="local batch (--hf-config; 1)")
    parser.add_argument("--seq", type=int, default=8192, help="sequence (--hf-config; 8192)")
    parser.add_argument(
        "--dtype", choices=tuple(DTYPES), default="bfloat16", help="parameter dtype (--hf-config)"
    )
    parser.add_argument("--optimizer", choices=("adamw", "sgd", "none"), default="adamw")
    parser.add_argument(
        "--budget", help="device memory per rank (default: what the target lets PyTorch allocate)"
    )
    parser.add_argument("--offload", metavar="LINK", help="a host link: adds remat + offload")
    parser.add_argument(
        "--alloc-conf",
        metavar="CONF",
        help="the CUDA caching allocator's settings for the reserved column, a "
        "PYTORCH_ALLOC_CONF string (default: this environment's, else torch's defaults)",
    )
    parser.add_argument("--regions", choices=REGIONS, default="choose")
    parser.add_argument(
        "--largest",
        nargs="+",
        choices=LARGEST,
        default=[],
        help="each row's largest batch / sequence that fits (--hf-config)",
    )
    parser.add_argument("--time-limit", type=float, default=120, help="seconds (default 120)")
    parser.add_argument("--plot", metavar="PATH", help="a stacked bar per strategy")
    parser.add_argument("--out", metavar="PATH", help="the rows as JSON")


def run_estimate(args: argparse.Namespace) -> int:
    factories = _factories(args)
    if args.hf_config:
        model, inputs, kwargs = model_from_config(args.hf_config, args.batch, args.seq, args.dtype)
    else:
        model, inputs, kwargs = load_model_from_args(args)
    fsdp = None
    if args.world_size > 1 and args.hf_config:
        fsdp = fsdp_policy(
            args.world_size, args.target, param_dtype=args.dtype, reduce_dtype="float32"
        )
    elif args.world_size < 1:
        raise ArgumentError(f"--world-size must be at least 1, not {args.world_size}")
    est = estimate(
        model,
        inputs,
        args.budget,
        example_kwargs=kwargs,
        target=args.target,
        world_size=args.world_size,
        fsdp=fsdp,
        optimizer=args.optimizer,
        offload=None if args.offload is None else parse_link(args.offload),
        regions=args.regions,
        time_limit=args.time_limit,
        factories=factories or None,
        alloc_conf=args.alloc_conf,
    )
    print(est.to_markdown())
    if args.plot:
        print(f"wrote {est.plot(args.plot)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(est.to_json(), f, indent=1)
        print(f"wrote {args.out}")
    return 0 if est.fits() else 1
