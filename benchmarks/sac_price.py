"""The price of torch's runtime: SAC plans against per-block checkpoint, a torchtitan-style
selective policy, remat's own executor and compile's activation_memory_budget.

    python -m benchmarks.sac_price --models gpt2_4 llama_4 resnet18 [--executor] [--compile 0.5]

Per zoo model (`benchmarks.zoo`, one thread), each run on its own copy of the model, measured
side by side in one process (peak: profiler allocation events above the step's start; time:
median of `--steps` steps after a warm-up):

- eager; per-block full checkpoint (`checkpoint(use_reentrant=False)` around each block);
- selective: per block, torchtitan's op-level policy (save mm/addmm/bmm and attention, of the
  matmuls only every second one);
- SAC optimum: `executor.checkpoint_plan` at per-block checkpoint's measured peak, or at the
  least budget SAC's model certifies where that is higher (budget, predicted and measured peak,
  bytes over, recompute seconds, status and gap);
- `--executor`: remat's executor optimum (`executor.rematerialize`) at the same budget, its
  recompute seconds (schedule cost over computing every node once) and step time;
- `--compile B`: `torch.compile` with `activation_memory_budget = B` (its knapsack), its
  measured peak, and the SAC optimum at that peak.
Step times are multiples of eager's. Writes sac_price.md/.csv under --out.
"""

from __future__ import annotations

import argparse
import copy
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
from executor.sac_command import measure_step
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
    from benchmarks.zoo import ZOO

    bench = ZOO[name]()
    model, inputs = bench.model, bench.inputs
    paths, modules_of = _blocks_of(model, bench.blocks)
    eager = measure_step(copy.deepcopy(model), inputs, {}, steps)
    m = copy.deepcopy(model)
    full = measure_step(per_block(m, modules_of(m), None), inputs, {}, steps)
    m = copy.deepcopy(model)
    selective = measure_step(per_block(m, modules_of(m), selective_contexts), inputs, {}, steps)
    row = {"model": name, "eager MiB": _mib(eager[0])}
    row |= {"full ckpt MiB": _mib(full[0]), "full ckpt x": _x(full, eager)}
    row |= {"selective MiB": _mib(selective[0]), "selective x": _x(selective, eager)}
    row |= _sac_row("SAC", model, inputs, paths, full[0], steps, time_limit, eager)
    if use_executor:
        row |= _executor_row(model, inputs, full[0], steps, time_limit, eager)
    if compile_budget is not None:
        row |= _compile_row(model, inputs, paths, compile_budget, steps, time_limit, eager)
    return row


def _sac_row(label, model, inputs, paths, budget, steps, time_limit, eager) -> dict:
    try:
        plan = executor.checkpoint_plan(model, inputs, budget, blocks=paths, time_limit=time_limit)
    except InfeasibleBudgetError as e:
        if e.minimum_bytes is None:
            return {f"{label} plan": f"none: {e}"}
        plan = executor.checkpoint_plan(
            model, inputs, e.minimum_bytes, blocks=paths, time_limit=time_limit
        )
    measured = measure_step(plan.apply(copy.deepcopy(model)), inputs, {}, steps)
    return {
        f"{label} budget MiB": _mib(plan.budget),
        f"{label} predicted MiB": _mib(plan.peak),
        f"{label} measured MiB": _mib(measured[0]),
        f"{label} over B": max(0, measured[0] - plan.budget),
        f"{label} meas/pred": f"{measured[0] / plan.peak:.3f}",
        f"{label} recompute ms": f"{plan.cost * 1e3:.2f}",
        f"{label} status/gap": f"{plan.status} {plan.gap:.1%}",
        f"{label} x": _x(measured, eager),
    }


def _executor_row(model, inputs, budget, steps, time_limit, eager) -> dict:
    rm = executor.rematerialize(copy.deepcopy(model), inputs, budget, time_limit=time_limit)
    schedule, dag = rm.schedule, rm.captured.dag
    once = sum(dag.nodes[n]["cost"] for n in dag.nodes)
    measured = measure_step(rm, inputs, {}, steps)
    return {
        "executor recompute ms": f"{(schedule.cost - once) * 1e3:.2f}",
        "executor MiB": _mib(measured[0]),
        "executor x": _x(measured, eager),
    }


def _compile_row(model, inputs, paths, budget, steps, time_limit, eager) -> dict:
    import torch._functorch.config as functorch_config

    with functorch_config.patch(activation_memory_budget=budget):
        compiled = torch.compile(copy.deepcopy(model))
        measured = measure_step(compiled, inputs, {}, steps)
    row = {f"knapsack {budget} MiB": _mib(measured[0]), "knapsack x": _x(measured, eager)}
    return row | _sac_row(
        "SAC@knapsack", model, inputs, paths, measured[0], steps, time_limit, eager
    )


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def _x(run: tuple[int, float], eager: tuple[int, float]) -> str:
    return f"{run[1] / eager[1]:.2f}"


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
