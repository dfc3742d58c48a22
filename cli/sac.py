"""`remat sac`: solve (or load) a SAC plan for ``--model`` and run it against eager.

    remat sac --model benchmarks.zoo:gpt2_4 --budget 50% --out plan.json
    remat sac --model benchmarks.zoo:gpt2_4 --plan plan.json --steps 10
    remat sac --model mypkg:llama_on_meta --target h100 --budget 60GiB --out plan.json

The factory returns ``(model, example_inputs[, example_kwargs])`` as for `remat run`; the step's
loss is `executor.default_loss` (``.loss``, or the output where it is a scalar). Printed:
the plan (status, predicted peak, cost: recompute seconds plus checkpoint price and SAC
overhead, gap, checkpointed regions), then for eager and the plan, each on its own copy of the
model: the measured peak (profiler allocation events, bytes above the step's start, `.grad`
created in the step) and the median step time. Exit status 0 only when the plan's measured peak
is within its budget. With ``--target NAME|FILE`` the plan is solved in estimate mode (no real
step; bytes and seconds predicted for the target, `executor.sac.recording.estimate`); a model on the
meta device is then only planned, not run. ``--world-size N`` plans for FSDP2 over N ranks (the
budget is device memory per rank) and runs nothing. ``--offload LINK`` (as `remat solve`'s:
a link or target name, or D2H,H2D[,HOST] in GB/s) lets the plan also offload saved ops to the
host (docs/sac.md, "Offload"); the plan's measured peak is then the device's, its host copies
told apart (`executor.sac.runtime.offload.measure_split`), and their measured host bytes are
printed."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from cli.profile import load_model_from_args
from cli.solve import parse_link
from executor.loss import default_loss
from executor.memory import median_seconds
from executor.sac.plan import CheckpointPlan
from executor.sac.planning import REGIONS, checkpoint_plan
from executor.sac.runtime.offload import measure_split
from solver.errors import ArgumentError

__all__ = ["add_sac_arguments", "measure_step", "run_sac"]


def add_sac_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        required=True,
        help="a callable returning (model, example_inputs[, example_kwargs])",
    )
    parser.add_argument(
        "--budget",
        default="50%",
        help="peak bytes of a step above what exists before it: bytes, 512MiB, a percentage "
        "of the step without checkpointing (100%%), or 'min' (default 50%%)",
    )
    parser.add_argument(
        "--blocks",
        nargs="+",
        metavar="PATTERN",
        default=None,
        help="module names or glob patterns of the blocks (default: the model's repeated blocks)",
    )
    parser.add_argument(
        "--regions",
        choices=REGIONS,
        default="choose",
        help="the candidate regions: per block the whole block or some of its children "
        "(choose, the default), whole blocks only, or children only",
    )
    parser.add_argument(
        "--target",
        metavar="NAME|FILE",
        help="plan in estimate mode for this device (a built-in name such as h100, cpu, or a "
        "device file from remat calibrate): no real step runs; a meta-device model is only "
        "planned",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="ranks FSDP2 shards the model over (fully_shard per block and at the root; "
        "default policy: float32 master weights, the model's dtype gathered, AdamW); the "
        "budget is then device memory per rank",
    )
    parser.add_argument(
        "--offload",
        metavar="LINK",
        help="also offload saved ops to the host over this link: pcie5, pcie4, c2c, a target "
        "(its host link) or D2H,H2D[,HOST] (GB/s, host bytes as 512GiB)",
    )
    parser.add_argument("--plan", metavar="FILE", help="run this saved plan instead of solving")
    parser.add_argument("--out", metavar="FILE", help="save the solved plan here")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median; default 5)")
    parser.add_argument("--time-limit", type=float, default=60, help="solve seconds (default 60)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")


def measure_step(
    model: nn.Module,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    steps: int,
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
) -> tuple[int, float, int]:
    """(measured peak bytes, median seconds, measured host bytes) of `model`'s training step
    (forward, loss, backward; `.grad` set to None before each), after one warm-up step; RNG
    restored after. The peak leaves out the host copies of an offloading SAC plan (their bytes
    at their most are the third number; 0 without)."""

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(*inputs, **kwargs)).backward()

    with torch.random.fork_rng():
        step()
        model.zero_grad(set_to_none=True)
        split = measure_split(step)
        seconds = median_seconds(step, repeats=steps, warmup=0)
    model.zero_grad(set_to_none=True)
    return split.device_peak, seconds, split.host_peak


def run_sac(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ArgumentError("--steps must be at least 1")
    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        model, inputs, kwargs = load_model_from_args(args)
        if args.plan:
            plan = CheckpointPlan.load(args.plan, model)
        else:
            plan = checkpoint_plan(
                model,
                inputs,
                args.budget,
                example_kwargs=kwargs,
                blocks=args.blocks,
                regions=args.regions,
                time_limit=args.time_limit,
                target=args.target,
                world_size=args.world_size,
                offload=None if args.offload is None else parse_link(args.offload),
            )
        if args.out:
            plan.save(args.out)
        basis = "" if plan.target is None else f" (predicted for {plan.target})"
        if plan.world_size > 1:
            basis += f", per rank of {plan.world_size} (FSDP2)"
        print(
            f"plan: {plan.status}, predicted peak {_mib(plan.peak)} within {_mib(plan.budget)} "
            f"(100% = {plan.plain_step}, {_mib(plan.plain_peak)}), cost "
            f"{plan.cost * 1e3:.2f} ms, gap "
            f"{plan.gap:.2%}; checkpointed {len(plan.checkpointed_regions())} of "
            f"{len(plan.regions)} regions, {sum(map(len, plan.saved))} ops saved{basis}"
        )
        if plan.link is not None:
            offloaded = sum(map(len, plan.offloads()))
            regions = sum(plan.plain_offloads())
            print(
                f"offload: {offloaded} saved ops of checkpointed regions, {regions} regions' "
                f"saved tensors; predicted host peak {_mib(plan.host_peak)}"
            )
        if plan.world_size > 1 or any(p.device.type == "meta" for p in model.parameters()):
            return 0  # a meta model has no values to run; a sharded plan runs on its ranks
        eager = measure_step(copy.deepcopy(model), inputs, kwargs, args.steps)
        planned = measure_step(plan.apply(copy.deepcopy(model)), inputs, kwargs, args.steps)
    finally:
        torch.set_num_threads(before)
    print(f"{'run':<8}{'measured peak':>16}{'step':>12}{'x eager':>9}")
    for name, (peak, seconds, _) in (("eager", eager), ("plan", planned)):
        print(f"{name:<8}{_mib(peak):>16}{seconds * 1e3:>9.2f} ms{seconds / eager[1]:>9.2f}")
    if plan.link is not None:
        print(f"plan measured / predicted host peak: {planned[2]:,} / {plan.host_peak:,}")
    print(
        f"plan measured / predicted peak: {planned[0] / plan.peak:.3f}; "
        f"bytes over budget: {max(0, planned[0] - plan.budget)}"
    )
    return 0 if planned[0] <= plan.budget else 1


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"
