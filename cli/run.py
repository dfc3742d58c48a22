"""`remat run`: train a model under a solved schedule and report what was measured.

The model is a demo (``--demo gpt``) or the user's own (``--model pkg.module:factory``, the
factory returning ``(model, example_inputs[, example_kwargs])`` as for `remat profile` and
`remat solve`). For N steps, copies of the model train side by side from the same initial
weights, each with its own optimizer and its own copy of the global RNG stream (swapped in and
out, so each sees exactly the stream eager would):

- eager: plain autograd;
- remat: `Rematerialized` under the exact schedule for ``--budget``;
- checkpoint: `torch.utils.checkpoint.checkpoint_sequential` with round(sqrt(n)) segments over
  the model's longest ``nn.Sequential`` (its blocks), the usual hand-placed baseline (skipped
  when the model has none).

The step is ``model(*inputs, **kwargs)`` and a backward from every differentiable output with
gradients of ones (``sum()`` of each output as the loss; a scalar loss gets 1), or only from
the outputs ``--backward-from`` names (``--backward-from loss`` for a HuggingFace model called
with ``labels=``). Before training, the remat copy is held against eager on the example
inputs as `executor.rematerialize` holds its module (`check_against_eager`): a difference ends
the run with `RematerializeError` (one line, exit 2). Printed: the budget, the solver's
predicted peak and the measured peak (profiler allocation events, bytes above the start of
the step, ``.grad`` allocated before it), measured / predicted; the median step time of each;
and whether remat's outputs, gradients and parameters were bit-identical to eager's on every
step. With a host link (``--offload``, or a schedule file that has one) also the host pool's
peak against the predicted host peak. Exit status 0 only when they were bit-identical, the
measured peak is within the budget and the host peak is the predicted one.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from cli.profile import (
    add_model_arguments,
    capture_with_args,
    load_model_from_args,
    output_names,
)
from cli.solve import parse_link
from executor.memory import measure_peak
from executor.traced.module import Rematerialized, check_against_eager, load_schedule
from executor.traced.offload import link_on
from graph_capture.models.demos import demo_model
from graph_capture.trace.zero_tangents import selected_outputs
from solver.errors import ArgumentError

__all__ = ["BUDGET_HELP", "add_run_arguments", "run_run", "sqrt_checkpointed"]

BUDGET_HELP = (
    "peak-memory budget of one training step: bytes above what is allocated before the step "
    "(parameters, buffers, inputs, .grad); as bytes, 512MiB, a percentage of the measured "
    "peak of the plain training step, or 'min': the least peak any schedule reaches, then "
    "the least recomputation at it"
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `remat run`."""
    parser.add_argument(
        "--demo", default=None, help="demo model to train: gpt, resnet, unet (default gpt)"
    )
    add_model_arguments(parser, demo=False)
    parser.set_defaults(threads=None)  # resolved by `_threads`
    parser.add_argument("--budget", default="50%", help=f"{BUDGET_HELP} (default 50%%)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument(
        "--schedule", default=None, help="a schedule file solved offline instead of solving"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="seconds for the capture, and as many for the exact solver (default 60)",
    )
    parser.add_argument(
        "--offload",
        default=None,
        metavar="LINK",
        help="also offload values to host memory and back over this link, as remat solve "
        "--offload spells it (docs/offload.md, 'Running offload')",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")


def sqrt_checkpointed(model: nn.Module) -> nn.Module | None:
    """`model` with its longest nn.Sequential run through checkpoint_sequential in
    round(sqrt(len)) segments (non-reentrant, RNG preserved), modified in place; None when it
    has no nn.Sequential of at least 2 blocks."""
    blocks = max(
        (m for m in model.modules() if isinstance(m, nn.Sequential)), key=len, default=None
    )
    if blocks is None or len(blocks) < 2:
        return None
    segments = max(1, round(math.sqrt(len(blocks))))
    inner = blocks.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return inner(x)
        return checkpoint_sequential(blocks, segments, x, use_reentrant=False)

    blocks.forward = forward  # type: ignore[method-assign]
    blocks.checkpoint_segments = segments
    return model


def _backward_from(out: object, names: Sequence[str | int] | None) -> list[torch.Tensor]:
    """Backward with gradients of ones from every differentiable output under the top-level
    output `names` (every one when None); returns the flat outputs (detached)."""
    leaves, spec = pytree.tree_flatten(out)
    chosen = range(len(leaves)) if names is None else selected_outputs(spec, names)
    diff = [x for k, x in enumerate(leaves) if k in chosen and isinstance(x, torch.Tensor)]
    diff = [x for x in diff if x.requires_grad]
    torch.autograd.backward(diff, [torch.ones_like(x) for x in diff])
    return [x.detach() for x in leaves if isinstance(x, torch.Tensor)]


_Call = tuple[Sequence[torch.Tensor], dict[str, torch.Tensor]]
"""A step's arguments: positional inputs and keyword inputs."""


@dataclass
class _Runner:
    """One training copy: its model, optimizer, its own RNG stream and its step times."""

    name: str
    model: nn.Module
    call: Callable[..., object]
    optimizer: torch.optim.Optimizer
    rng: torch.Tensor
    seconds: list[float]
    backward_from: Sequence[str | int] | None = None

    def step(self, inputs: _Call) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One training step on this copy's RNG stream; returns (outputs, grads before update)."""
        torch.set_rng_state(self.rng)
        self.optimizer.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        outputs = _backward_from(self.call(*inputs[0], **inputs[1]), self.backward_from)
        self.seconds.append(time.perf_counter() - t0)
        grads = [p.grad.clone() for p in self.model.parameters()]
        self.optimizer.step()
        self.rng = torch.get_rng_state()
        return outputs, grads

    def peak_bytes(self, inputs: _Call) -> int:
        """Measured peak of one forward+backward, RNG state and weights left unchanged."""
        saved = [p.detach().clone() for p in self.model.parameters()]
        grads = [p.grad.clone() for p in self.model.parameters()]
        state = {k: v.clone() for k, v in self.model.state_dict().items()}
        with torch.random.fork_rng(devices=[]):
            step = lambda: _backward_from(  # noqa: E731
                self.call(*inputs[0], **inputs[1]), self.backward_from
            )
            peak = measure_peak(step).peak_bytes
        with torch.no_grad():
            for p, w, g in zip(self.model.parameters(), saved, grads, strict=True):
                p.copy_(w)
                p.grad.copy_(g)
        self.model.load_state_dict(state)
        return peak


def _threads(args: argparse.Namespace) -> int:
    """The intra-op thread count of the run: ``--threads``; else, with ``--schedule``, the count
    its graph was captured with (the transient bytes an op needs depend on it, so the capture of
    this run must have the same to match the schedule); else 1."""
    if args.threads:
        return args.threads
    if args.schedule:
        import solver

        return int(solver.Schedule.load(args.schedule).extra.get("threads", 1))
    return 1


def _schedule(args: argparse.Namespace, captured, device: torch.device):  # -> solver.Schedule
    """The --schedule file's schedule, or the solve's, its link's host rounding that of the
    host pool on `device` (where the copies run)."""
    import solver

    if args.schedule:
        if args.offload:
            raise ArgumentError("--offload solves; a --schedule file has its own link (or none)")
        return load_schedule(args.schedule, captured.dag)
    link = None if args.offload is None else link_on(parse_link(args.offload), device)
    return solver.solve(captured.dag, budget=args.budget, time_limit=args.time_limit, offload=link)


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def run_run(args: argparse.Namespace) -> int:
    """Train ``--demo`` or ``--model`` for ``--steps`` steps under the schedule; print the
    comparison."""
    if args.demo and args.model:
        raise ArgumentError("give either --demo or --model, not both")
    if not args.model:
        args.demo = args.demo or "gpt"
        demo_model(args.demo)  # a demo model, or CaptureError naming them
    if args.steps < 2:
        raise ArgumentError("--steps must be at least 2 (the first step is warm-up for timing)")
    threads = torch.get_num_threads()
    args.threads = _threads(args)
    torch.set_num_threads(args.threads)
    try:
        return _train_and_report(args, *load_model_from_args(args))
    finally:
        torch.set_num_threads(threads)


def _runners(
    model: nn.Module,
    captured,  # CapturedGraph
    schedule,  # solver.Schedule
    lr: float,
    backward_from: Sequence[str | int] | None,
    example: _Call,
) -> list[_Runner]:
    """Eager, remat and (when the model has an nn.Sequential) checkpoint copies of `model`,
    each with AdamW, preallocated .grad, the current RNG state, and the outputs its step
    backpropagates from. The remat copy is held against eager on ``example`` first, as
    `executor.rematerialize` holds its module (`check_against_eager`: `RematerializeError`)."""
    start_rng = torch.get_rng_state()
    runners = []
    for name in ("eager", "remat", "checkpoint"):
        copy_ = copy.deepcopy(model)
        call: Callable[..., object] | None = copy_
        if name == "remat":
            call = Rematerialized(copy_, captured, schedule)
            check_against_eager(call, *example)
        elif name == "checkpoint":
            call = sqrt_checkpointed(copy_)
        if call is None:
            continue
        opt = torch.optim.AdamW(copy_.parameters(), lr=lr)
        for p in copy_.parameters():
            p.grad = torch.zeros_like(p)
        runners.append(_Runner(name, copy_, call, opt, start_rng.clone(), [], backward_from))
    return runners


def _train_and_report(
    args: argparse.Namespace,
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    kwargs: dict[str, torch.Tensor],
) -> int:
    """Capture, solve, train the copies side by side and print the report."""
    captured = capture_with_args(args, model, inputs, kwargs, summary=sys.stdout)
    call = (inputs, kwargs)
    device = next(model.parameters()).device
    schedule = _schedule(args, captured, device)
    runners = _runners(model, captured, schedule, args.lr, output_names(args), call)
    mismatches, same_params = _train_side_by_side(runners, args.steps, call)
    pool = runners[1].call.host_pool  # remat's
    if pool is not None:
        pool.reset_peak()  # between steps: no copy is held
    peaks = {r.name: r.peak_bytes(call) for r in runners}
    times = {r.name: statistics.median(r.seconds[1:]) for r in runners}

    what = args.model or args.demo
    plan = f"schedule {args.schedule}" if args.schedule else f"budget {args.budget}"
    print(f"remat run: {what}, {plan}, {args.steps} steps, {args.threads} thread(s)")
    budget = schedule.budget
    print(
        f"schedule: {schedule.method} {schedule.status}, {len(schedule.ops)} ops, "
        f"{schedule.recomputes} recomputes, budget {'-' if budget is None else _mib(budget)}"
    )
    _print_predicted_cost(captured, schedule)
    measured = peaks["remat"]
    limit = schedule.peak if budget is None else budget
    print(f"predicted peak (solver)   {_mib(schedule.peak)}")
    print(
        f"measured peak (profiler)  {_mib(measured)}   measured / predicted "
        f"{measured / max(1, schedule.peak):.3f}"
    )
    within = measured <= limit
    print(
        f"  measured <= {'budget' if budget is not None else 'predicted'}: "
        f"{'yes' if within else 'NO'} ({measured} <= {limit} bytes)"
    )
    host_as_predicted = True
    if pool is not None:
        predicted_host = schedule.extra["host_peak"]
        host_as_predicted = pool.host_peak == predicted_host
        print(
            f"host peak (pool)          {_mib(pool.host_peak)}   predicted "
            f"{_mib(predicted_host)}, equal: {'yes' if host_as_predicted else 'NO'} "
            f"({schedule.extra['offloads']} offloads, {schedule.extra['reloads']} reloads)"
        )
    _print_times(runners, peaks, times)
    exact = not mismatches and same_params
    print(
        f"bit-identical to eager on every step (outputs, grads, params): {'yes' if exact else 'NO'}"
    )
    for line in mismatches[:10]:
        print(f"  mismatch: {line}")
    return 0 if exact and within and host_as_predicted else 1


def _train_side_by_side(
    runners: list[_Runner], steps: int, call: tuple[tuple, dict]
) -> tuple[list[str], bool]:
    """Train every runner `steps` steps on `call`: what differed between eager (the first) and
    remat (the second) at each step (outputs, a gradient), and whether their parameters are
    equal after the last."""
    eager, remat = runners[0], runners[1]
    mismatches: list[str] = []
    names = [n for n, _ in eager.model.named_parameters()]
    for k in range(steps):
        (out_e, grads_e), (out_r, grads_r), *_ = (r.step(call) for r in runners)
        if not all(torch.equal(a, b) for a, b in zip(out_e, out_r, strict=True)):
            mismatches.append(f"step {k}: outputs")
        mismatches += [
            f"step {k}: grad of {n}"
            for n, a, b in zip(names, grads_e, grads_r, strict=True)
            if not torch.equal(a, b)
        ]
    same_params = all(
        torch.equal(a, b)
        for a, b in zip(
            eager.model.state_dict().values(), remat.model.state_dict().values(), strict=True
        )
    )
    return mismatches, same_params


def _print_predicted_cost(captured, schedule) -> None:  # CapturedGraph, solver.Schedule
    """The schedule's predicted recompute cost, and its step overhead where the capture
    measured the plain step."""
    from solver import prepare

    problem = prepare(captured.dag)
    print(
        f"predicted recompute cost  {100 * (schedule.cost / problem.total_cost - 1):+.1f}% of "
        f"computing each node once ({captured.cost_model} cost model)"
    )
    if problem.step_cost is not None:
        print(
            f"predicted step overhead   {100 * problem.overhead(schedule.cost):+.1f}% of the "
            "plain step measured at capture"
        )


def _print_times(runners: list[_Runner], peaks: dict[str, int], times: dict[str, float]) -> None:
    print(f"{'run':<28} {'measured peak':>14} {'step time':>11} {'vs eager':>9}")
    for r in runners:
        label = {"eager": "eager", "remat": "remat (this schedule)"}.get(r.name)
        if label is None:
            segments = next(
                m.checkpoint_segments
                for m in r.model.modules()
                if hasattr(m, "checkpoint_segments")
            )
            label = f"checkpoint sqrt(n)={segments} seg"
        print(
            f"{label:<28} {_mib(peaks[r.name]):>14} "
            f"{1e3 * times[r.name]:>8.2f} ms {100 * (times[r.name] / times['eager'] - 1):>+8.1f}%"
        )
