"""`remat run`: train a demo model under a solved schedule and report what was measured.

For N steps, three copies of the model train side by side from the same initial weights, each
with its own optimizer and its own copy of the global RNG stream (swapped in and out, so each
sees exactly the stream eager would):

- eager: plain autograd;
- remat: `Rematerialized` under the exact schedule for ``--budget``;
- checkpoint: `torch.utils.checkpoint.checkpoint_sequential` with round(sqrt(n)) segments over
  the model's longest ``nn.Sequential`` (its blocks), the usual hand-placed baseline.

Printed: the solver's predicted peak and the measured peak (profiler allocation events, bytes
above the start of the step, ``.grad`` preallocated), with the measured allowance; the median
step time of each; and whether remat's outputs, gradients and parameters were bit-identical to
eager's on every step.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from executor.memory import measure_peak
from executor.module import Rematerialized

__all__ = ["add_run_arguments", "run_run", "sqrt_checkpointed"]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `remat run`."""
    parser.add_argument(
        "--demo", default="gpt", help="demo model to train: gpt, resnet, unet (default gpt)"
    )
    parser.add_argument(
        "--budget",
        default="50%",
        help="peak-memory budget: bytes, 512MiB, a percentage of the checkpoint-all peak, or "
        "'min' for the least memory any schedule needs (default 50%%)",
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument(
        "--schedule", default=None, help="a schedule file solved offline instead of solving"
    )
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds for the exact solver (default 60)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads for all runs (default 1)"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")


def sqrt_checkpointed(model: nn.Module) -> nn.Module:
    """`model` with its longest nn.Sequential run through checkpoint_sequential in
    round(sqrt(len)) segments (non-reentrant, RNG preserved). Modifies `model` in place."""
    blocks = max(
        (m for m in model.modules() if isinstance(m, nn.Sequential)), key=len, default=None
    )
    if blocks is None or len(blocks) < 2:
        raise ValueError("sqrt_checkpointed needs a model with an nn.Sequential of >= 2 blocks")
    segments = max(1, round(math.sqrt(len(blocks))))
    inner = blocks.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return inner(x)
        return checkpoint_sequential(blocks, segments, x, use_reentrant=False)

    blocks.forward = forward  # type: ignore[method-assign]
    blocks.checkpoint_segments = segments
    return model


@dataclass
class _Runner:
    """One training copy: its model, optimizer, its own RNG stream and its step times."""

    name: str
    model: nn.Module
    call: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    rng: torch.Tensor
    seconds: list[float]

    def step(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One training step on this copy's RNG stream; returns (loss, grads before update)."""
        torch.set_rng_state(self.rng)
        self.optimizer.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        loss = self.call(*inputs)
        loss.backward()
        self.seconds.append(time.perf_counter() - t0)
        grads = [p.grad.clone() for p in self.model.parameters()]
        self.optimizer.step()
        self.rng = torch.get_rng_state()
        return loss.detach(), grads

    def peak_bytes(self, inputs: Sequence[torch.Tensor]) -> int:
        """Measured peak of one forward+backward, RNG state and weights left unchanged."""
        saved = [p.detach().clone() for p in self.model.parameters()]
        grads = [p.grad.clone() for p in self.model.parameters()]
        state = {k: v.clone() for k, v in self.model.state_dict().items()}
        with torch.random.fork_rng(devices=[]):
            peak = measure_peak(lambda: self.call(*inputs).backward()).peak_bytes
        with torch.no_grad():
            for p, w, g in zip(self.model.parameters(), saved, grads, strict=True):
                p.copy_(w)
                p.grad.copy_(g)
        self.model.load_state_dict(state)
        return peak


def _schedule(args: argparse.Namespace, captured):  # -> solver.Schedule
    import solver

    if args.schedule:
        return solver.Schedule.load(args.schedule, captured.dag)
    if str(args.budget).strip().lower() == "min":
        return solver.minimum_peak(captured.dag, time_limit=args.time_limit)
    return solver.solve(captured.dag, budget=args.budget, time_limit=args.time_limit)


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def run_run(args: argparse.Namespace) -> int:
    """Train ``--demo`` for ``--steps`` steps under the schedule; print the comparison."""
    from graph_capture.demos import demo_model

    factory = demo_model(args.demo)
    if args.steps < 2:
        raise ValueError("--steps must be at least 2 (the first step is warm-up for timing)")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _train_and_report(args, factory)
    finally:
        torch.set_num_threads(threads)


def _train_and_report(
    args: argparse.Namespace, factory: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
) -> int:
    """Capture, solve, train the three copies side by side and print the report."""
    from graph_capture import capture
    from solver import prepare

    model, inputs = factory()
    captured = capture(model, inputs)
    schedule = _schedule(args, captured)

    start_rng = torch.get_rng_state()
    runners = []
    for name in ("eager", "remat", "checkpoint"):
        copy_ = copy.deepcopy(model)
        call: Callable[..., torch.Tensor] = copy_
        if name == "remat":
            call = Rematerialized(copy_, captured, schedule)
        elif name == "checkpoint":
            call = sqrt_checkpointed(copy_)
        opt = torch.optim.AdamW(copy_.parameters(), lr=args.lr)
        for p in copy_.parameters():
            p.grad = torch.zeros_like(p)
        runners.append(_Runner(name, copy_, call, opt, start_rng.clone(), []))
    eager, remat, ckpt = runners

    mismatches: list[str] = []
    for k in range(args.steps):
        (loss_e, grads_e), (loss_r, grads_r), _ = (r.step(inputs) for r in runners)
        if not torch.equal(loss_e, loss_r):
            mismatches.append(f"step {k}: loss")
        names = [n for n, _ in eager.model.named_parameters()]
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

    peaks = {r.name: r.peak_bytes(inputs) for r in runners}
    allowance = remat.call.peak_allowance(inputs)
    times = {r.name: statistics.median(r.seconds[1:]) for r in runners}
    segments = next(
        m.checkpoint_segments for m in ckpt.model.modules() if hasattr(m, "checkpoint_segments")
    )

    print(
        f"remat run: {args.demo}, budget {args.budget}, {args.steps} steps, "
        f"{args.threads} thread(s)"
    )
    print(
        f"schedule: {schedule.method} {schedule.status}, {len(schedule.ops)} ops, "
        f"{schedule.recomputes} recomputes, budget "
        f"{'-' if schedule.budget is None else _mib(schedule.budget)}"
    )
    total = prepare(captured.dag).total_cost
    print(
        f"predicted recompute cost  {100 * (schedule.cost / total - 1):+.1f}% of one plain step "
        f"({captured.cost_model} cost model)"
    )
    print(f"predicted peak (solver)   {_mib(schedule.peak)}")
    print(
        f"measured peak (profiler)  {_mib(peaks['remat'])}   "
        f"[allowance {_mib(allowance['total'])}: op scratch {_mib(allowance['op_scratch'])}, "
        f"bookkeeping {_mib(allowance['bookkeeping'])}, outputs "
        f"{_mib(allowance['held_outputs'])}]"
    )
    within = schedule.peak <= peaks["remat"] <= schedule.peak + allowance["total"]
    print(
        f"  within allowance: {'yes' if within else 'NO'} (measured - predicted = "
        f"{peaks['remat'] - schedule.peak} bytes, allowance {allowance['total']} bytes)"
    )
    print(f"{'run':<28} {'measured peak':>14} {'step time':>11} {'vs eager':>9}")
    labels = {
        "eager": "eager",
        "remat": "remat (this schedule)",
        "checkpoint": f"checkpoint sqrt(n)={segments} seg",
    }
    for r in runners:
        print(
            f"{labels[r.name]:<28} {_mib(peaks[r.name]):>14} "
            f"{1e3 * times[r.name]:>8.2f} ms {100 * (times[r.name] / times['eager'] - 1):>+8.1f}%"
        )
    exact = not mismatches and same_params
    print(f"bit-identical to eager on every step (loss, grads, params): {'yes' if exact else 'NO'}")
    for line in mismatches[:10]:
        print(f"  mismatch: {line}")
    return 0 if exact and within else 1
