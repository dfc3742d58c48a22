"""The price of torch's runtime: SAC plans against per-block checkpoint, a torchtitan-style
selective policy, remat's own executor and compile's activation_memory_budget.

    python -m benchmarks.running.sac_price --models gpt2_4 llama_4 resnet18 [--executor] [--compile
        0.5]

Per zoo model (`benchmarks.zoo`, one thread), each run on its own copy of the model, measured
side by side in one process (peak: profiler allocation events above the step's start; time:
median of `--steps` steps after a warm-up, the runs' steps interleaved):

- eager; per-block full checkpoint (`checkpoint(use_reentrant=False)` around each block);
- selective: per block, torchtitan's op-level policy (save mm/addmm/bmm and attention, of the
  matmuls only every second one);
- SAC runtime: per block, a SAC policy recomputing every op (full checkpoint's recompute through
  SAC's dispatch modes: the price of the runtime itself);
- SAC optimum: `executor.checkpoint_plan` at per-block checkpoint's measured peak, or at the
  least budget SAC's model certifies where that is higher ("least MiB": that least peak, or
  "fits"); per block no region, the whole block or some of its children ("regions": how many
  blocks and children it checkpoints, and how many of those save no op and run as plain
  checkpoint); budget, predicted and measured peak, bytes over, its cost ("recompute ms":
  recompute seconds plus each region's checkpoint price plus the SAC runtime overhead of the
  regions that save an op, measured when recorded; "runtime ms": that overhead alone; "model
  x": eager's step plus that cost, over eager's step), status and gap, step time over full
  checkpoint's ("/ full") and the space's certified floor of that ratio ("floor / full":
  eager's step plus the proven lower bound on the cost, over full checkpoint's step);
- `--executor`: remat's executor optimum (`executor.rematerialize`) at the same budget, its
  recompute seconds (schedule cost over computing every node once) and step time;
- `--compile B`: `torch.compile` with `activation_memory_budget = B` (its knapsack), its
  measured peak, and the SAC optimum at that peak.
Step times are multiples of eager's. Writes sac_price.md/.csv under --out.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import executor
from benchmarks.common import write_table
from executor.loss import default_loss
from executor.memory import measure_peak
from solver.errors import InfeasibleBudgetError

_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
}


def selective_contexts():
    """torchtitan's op-level SAC policy: save attention and every second matmul."""
    matmuls = [0]

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in _ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        if op in _MATMULS:
            matmuls[0] += 1
            return (
                CheckpointPolicy.MUST_SAVE if matmuls[0] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
            )
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def recompute_all_contexts():
    """A SAC policy recomputing every op: per-block full checkpoint's recompute, run through
    SAC's dispatch modes (their own price)."""
    return create_selective_checkpoint_contexts(
        lambda ctx, op, *args, **kwargs: CheckpointPolicy.MUST_RECOMPUTE
    )


def per_block(model: nn.Module, blocks: list[nn.Module], context_fn: Callable | None) -> nn.Module:
    """`model` with each block's forward inside `checkpoint(use_reentrant=False)` (in place)."""
    for block in blocks:
        forward = block.forward
        extra = {"context_fn": context_fn} if context_fn else {}

        def run(*args, _f=forward, _extra=extra, **kwargs):
            return checkpoint(_f, *args, use_reentrant=False, **_extra, **kwargs)

        block.forward = run
    return model


def _blocks_of(model: nn.Module, blocks: list[nn.Module]) -> tuple[list[str], Callable]:
    names = {id(m): n for n, m in model.named_modules()}
    paths = [names[id(b)] for b in blocks]

    def modules_of(m: nn.Module) -> list[nn.Module]:
        table = dict(m.named_modules())
        return [table[p] for p in paths]

    return paths, modules_of


def price(name: str, steps: int, time_limit: float, use_executor: bool, compile_budget) -> dict:
    """One row of the table: every run built first (plans solved at measured peaks), then all
    measured together, their timed steps interleaved so that load on the machine falls on all
    alike."""
    from benchmarks.zoo import ZOO

    bench = ZOO[name]()
    model, inputs = bench.model, bench.inputs
    paths, modules_of = _blocks_of(model, bench.blocks)

    def wrapped(context_fn) -> nn.Module:
        m = copy.deepcopy(model)
        return per_block(m, modules_of(m), context_fn)

    runs = {"eager": copy.deepcopy(model), "full ckpt": wrapped(None)}
    runs["selective"] = wrapped(selective_contexts)
    runs["SAC runtime"] = wrapped(recompute_all_contexts)
    full_peak = _measure({"full ckpt": runs["full ckpt"]}, inputs, 0)["full ckpt"][0]
    row: dict[str, object] = {"model": name}
    plans = {"SAC": _plan(model, inputs, paths, full_peak, time_limit, row, "SAC")}
    if use_executor:
        rm = executor.rematerialize(copy.deepcopy(model), inputs, full_peak, time_limit=time_limit)
        dag = rm.captured.dag
        once = sum(dag.nodes[n]["cost"] for n in dag.nodes)
        row["executor recompute ms"] = f"{(rm.schedule.cost - once) * 1e3:.2f}"
        runs["executor"] = rm
    if compile_budget is not None:
        import torch._functorch.config as functorch_config

        label = f"knapsack {compile_budget}"
        with functorch_config.patch(activation_memory_budget=compile_budget):
            runs[label] = torch.compile(copy.deepcopy(model))
            knapsack_peak = _measure({label: runs[label]}, inputs, 0)[label][0]
        plans["SAC@knapsack"] = _plan(
            model, inputs, paths, knapsack_peak, time_limit, row, "SAC@knapsack"
        )
    for label, plan in plans.items():
        runs[label] = plan.apply(copy.deepcopy(model))
    measured = _measure(runs, inputs, steps)
    eager_seconds, full_seconds = measured["eager"][1], measured["full ckpt"][1]
    for label, (peak, seconds) in measured.items():
        row[f"{label} MiB"] = _mib(peak)
        row[f"{label} x"] = f"{seconds / eager_seconds:.2f}"
        if label in plans:
            plan = plans[label]
            row[f"{label} budget MiB"] = _mib(plan.budget)
            row[f"{label} predicted MiB"] = _mib(plan.peak)
            row[f"{label} over B"] = max(0, peak - plan.budget)
            row[f"{label} meas/pred"] = f"{peak / plan.peak:.3f}"
            row[f"{label} recompute ms"] = f"{plan.cost * 1e3:.2f}"
            row[f"{label} model x"] = f"{(eager_seconds + plan.cost) / eager_seconds:.2f}"
            row[f"{label} status/gap"] = f"{plan.status} {plan.gap:.1%}"
            whole = sum(n in paths for n in plan.checkpointed_regions())
            plain, overhead = _plain_regions(plan)
            row[f"{label} regions"] = (
                f"{whole} blocks, {len(plan.checkpointed_regions()) - whole} children, "
                f"{plain} plain"
            )
            row[f"{label} runtime ms"] = f"{overhead * 1e3:.2f}"
            row[f"{label} / full"] = f"{seconds / full_seconds:.2f}"
            row[f"{label} floor / full"] = f"{(eager_seconds + plan.bound) / full_seconds:.2f}"
    return row


def _plain_regions(plan: executor.CheckpointPlan) -> tuple[int, float]:
    """How many of the plan's regions save no op (run as plain checkpoint), and the seconds of
    SAC runtime overhead the others pay in the plan's cost."""
    union = plan.problem
    regions = []
    for block, split in zip(union.blocks.blocks, union.splits, strict=True):
        regions += [block, *(split.children if split is not None else ())]
    flags = zip(regions, plan.checkpointed, plan.saved, strict=True)
    chosen = [(region, saved) for region, c, saved in flags if c]
    return sum(not saved for _, saved in chosen), sum(r.overhead for r, s in chosen if s)


def _plan(
    model, inputs, paths, budget: int, time_limit: float, row: dict, label: str
) -> executor.CheckpointPlan:
    """The SAC plan at `budget` (regions chosen between the blocks and their children), or at
    the least budget SAC's model certifies if higher; `row[label + " least MiB"]` is that least
    peak, or "fits" where the budget fits."""
    row[f"{label} least MiB"] = "fits"
    try:
        return executor.checkpoint_plan(model, inputs, budget, blocks=paths, time_limit=time_limit)
    except InfeasibleBudgetError as e:
        if e.minimum_bytes is None:
            raise
        row[f"{label} least MiB"] = _mib(e.minimum_bytes)
        return executor.checkpoint_plan(
            model, inputs, e.minimum_bytes, blocks=paths, time_limit=time_limit
        )


def _measure(runs: dict[str, nn.Module], inputs, steps: int) -> dict[str, tuple[int, float]]:
    """(measured peak bytes, median step seconds) of each model's training step (`.grad`
    None before it, so its gradients count), after a warm-up step each; the `steps` timed
    steps of the models interleaved."""
    calls = {}
    for label, m in runs.items():

        def step(m=m) -> None:
            default_loss(m(*inputs)).backward()

        calls[label] = step
    with torch.random.fork_rng():
        peaks = {}
        for label, step in calls.items():
            step()
            runs[label].zero_grad(set_to_none=True)
            peaks[label] = measure_peak(step).peak_bytes
        times: dict[str, list[float]] = {label: [] for label in calls}
        for _ in range(steps):
            for label, step in calls.items():
                runs[label].zero_grad(set_to_none=True)
                start = time.perf_counter()
                step()
                times[label].append(time.perf_counter() - start)
    return {
        label: (peaks[label], statistics.median(times[label]) if steps else 0.0) for label in calls
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2_4", "llama_4"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=60)
    parser.add_argument("--executor", action="store_true", help="also remat's own executor")
    parser.add_argument(
        "--compile",
        type=float,
        default=None,
        metavar="B",
        help="also torch.compile with activation_memory_budget=B",
    )
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.models:
        rows.append(price(name, args.steps, args.time_limit, args.executor, args.compile))
        print(rows[-1], flush=True)
    path = write_table(rows, args.out, "sac_price", "SAC plans: the price of torch's runtime")
    print(path.read_text())


if __name__ == "__main__":
    main()
