"""`estimate`: will a training step fit, and how fast, under every checkpointing strategy.

    est = executor.estimate(model, (ids,), example_kwargs={"labels": ids}, target="h100",
                            world_size=8)
    print(est.to_markdown()); est.plot("strategies.png"); est.fits("h100")

One recording of the step (`executor.sac.planning.record_step`: estimate mode for a target,
measured here without one) is solved and evaluated for each strategy (`STRATEGIES`); every
row's bytes are the same per-rank model (`solver.target.components.peak_components`), its
seconds the plain step's plus what the strategy adds (`solver.sac.union.union_cost`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from executor.errors import PlanError
from executor.estimation.report import StepEstimate, StrategyEstimate
from executor.estimation.step_seconds import measured_step_seconds, predicted_step_seconds
from executor.fitting.memory import predicted_static
from executor.loss import default_loss
from executor.sac.plan import CheckpointPlan
from executor.sac.planning import RecordedStep, StepOptions, record_step
from executor.sac.step import in_call_order
from graph_capture.inputs import positional_inputs
from solver.core.budget import BYTES, Budget
from solver.core.link import Link
from solver.errors import InfeasibleBudgetError
from solver.interrupt import call_deadline
from solver.sac.policies import POLICIES, policy_plan, sac_overhead
from solver.sac.sharded import plan_windows
from solver.sac.union import UnionPlan, union_cost
from solver.spelling import spelled
from solver.target import Device, FsdpMemory, FsdpPolicy
from solver.target.components import peak_components, plain_memory
from solver.target.devices import host_link

__all__ = ["STRATEGIES", "estimate"]

STRATEGIES = (
    "none",
    "full",
    "selective",
    "torch.compile",
    "remat",
    "remat + offload",
)
"""The rows of an estimate, in order: no checkpointing; every block checkpointed (saving
nothing); torchtitan's selective op policy (SDPA and every second matmul saved); torch.compile's
memory-budget partition at its default; remat's exact SAC plan at the usable memory; the same
with offload to the host (where a link is given, one process)."""

COMPILE_NOTE = (
    "not predicted: torch.compile's default partition (activation_memory_budget 1.0) is a "
    "min-cut over its fused graph, which a fake eager step does not show"
)


def _machine_memory() -> int:
    """Bytes of this machine's physical memory (the budget measured here without one)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _tokens(inputs: Sequence[object], kwargs: Mapping[str, object]) -> tuple[int | None, int]:
    """(token ids per step: the elements of the first integer tensor of at least two
    dimensions, None where there is none; samples per step: the first tensor's first dim)."""
    tensors = [t for t in (*inputs, *kwargs.values()) if isinstance(t, torch.Tensor)]
    ids = [t for t in tensors if t.dim() >= 2 and not t.is_floating_point()]
    samples = tensors[0].shape[0] if tensors and tensors[0].dim() else 1
    return (ids[0].numel() if ids else None), samples


def _grad_groups(
    step: RecordedStep,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    rounding: int,
) -> tuple[list[int], int]:
    """(bytes of each block's trainable parameters' gradients, then the root's; bytes of the
    root's whose module a forward first calls after the last block: the head's), a parameter
    counted once, rounded as the device's allocator. The call order is one forward without
    grad under the recording's measurer."""

    def nbytes(params: Sequence[nn.Parameter]) -> int:
        return sum(-(-p.numel() * p.element_size() // rounding) * rounding for p in params)

    model = step.model
    seen: set[int] = set()
    grads = []
    for _, block in step.named:
        params = [p for p in block.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        grads.append(nbytes(params))
    owners = [
        (name, m)
        for name, m in model.named_modules()
        if any(id(p) not in seen for p in m.parameters(recurse=False))
    ]
    with step.measurer.running(model, (list(inputs), dict(kwargs))) as (args, kw):
        order = in_call_order(
            model, [*step.named[-1:], *owners], lambda: loss_fn(model(*args, **kw))
        )
    names = [name for name, _ in order]
    last = names.index(step.named[-1][0]) if step.named[-1][0] in names else len(names)
    head = {id(p) for name, m in order[last + 1 :] for p in m.parameters(recurse=False)}
    rest = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad and id(p) not in seen]
    return [*grads, nbytes(rest)], nbytes([p for p in rest if id(p) in head])


@dataclass(frozen=True)
class _Basis:
    """What every row shares: the per-rank model, bytes outside the model and of the head's
    gradients (`peak_components`), and the plain step's seconds."""

    memory: FsdpMemory
    other: int
    head_grads: int
    plain: float


def _row(name: str, step: RecordedStep, plan: UnionPlan, basis: _Basis) -> StrategyEstimate:
    """A strategy's row from its plan over the recorded union."""
    memory = basis.memory
    windows = plan_windows(step.union, plan)
    components = peak_components(memory, windows, basis.other, basis.head_grads)
    recompute = union_cost(step.union, plan)
    peak_at = _peak_at(memory, windows)
    overhead = sac_overhead(step.union, plan)
    note = f"SAC overhead {overhead:.3g} s of it" if overhead else ""
    seconds = basis.plain + recompute
    return StrategyEstimate(name, components, peak_at, recompute, seconds, "fixed", note=note)


def _peak_at(memory: FsdpMemory, windows) -> str:
    from solver.target import predict_peak

    peak = predict_peak(memory, windows)
    return f"{peak.window}, {peak.level}"


def _solved(
    name: str,
    step: RecordedStep,
    budget: int,
    deadline,
    link: Link | None,
    rows: Callable[[str, UnionPlan], StrategyEstimate],
) -> StrategyEstimate:
    """remat's row: the least-cost plan within `budget` bytes (per rank, for the step: what
    `RecordedStep.solve` reads), or a row saying no plan fits and the least peak."""
    try:
        plan: CheckpointPlan = step.solve(Budget.of(budget), deadline, link)
    except InfeasibleBudgetError as e:
        return StrategyEstimate(
            name, None, "", 0.0, 0.0, "infeasible", least=e.minimum_bytes, note="no plan fits"
        )
    except PlanError as e:
        return StrategyEstimate(name, None, "", 0.0, 0.0, "infeasible", note=str(e))
    row = rows(name, plan.union_plan())
    return StrategyEstimate(
        name,
        row.components,
        row.peak_at,
        plan.cost,
        row.seconds - row.recompute + plan.cost,
        f"{plan.status} gap {plan.gap:.2%}",
        host_bytes=plan.host_peak,
    )


@spelled
def estimate(
    model: nn.Module,
    example_inputs: Sequence[object] | torch.Tensor,
    budget: str | int | None = None,
    *,
    example_kwargs: Mapping[str, object] | None = None,
    target: str | Device | None = None,
    world_size: int = 1,
    fsdp: FsdpPolicy | None = None,
    optimizer: str = "adamw",
    offload: Link | str | None = None,
    blocks: Sequence[str] | None = None,
    regions: str = "choose",
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
    time_limit: float = 120,
) -> StepEstimate:
    """Every strategy's bytes per rank, verdict and step seconds for one training step of
    `model` on the example inputs (`loss_fn(model(*example_inputs, **example_kwargs))
    .backward()`, then `optimizer`'s step: "adamw", "sgd" or "none"), side by side
    (`StepEstimate`; rows `STRATEGIES`).

    `budget`: the device memory per rank the rows are judged against and remat's plan is
    solved for (bytes or units such as "80GiB"); None: what `target` lets PyTorch allocate
    (`Device.usable`), or this machine's physical memory without a target. `target`: a device
    name, file or `Device` (estimate mode: nothing real runs, the model may be on the meta
    device); None: measured here. `world_size` > 1 or `fsdp`: FSDP2 per rank, as
    `checkpoint_plan`'s. `offload`: a host link (one process): the "remat + offload" row.
    `blocks`, `regions`, `loss_fn`: as `checkpoint_plan`'s. `time_limit`: seconds for the
    whole call (the recording takes at most half; each solve what is left).

    Exception to the 8-parameter and 80-line rules: a public entry point whose keyword-only
    parameters are the one interface's options, each documented here."""
    if budget is not None and Budget.of(budget).kind != BYTES:
        raise PlanError(
            f"estimate's budget is device memory per rank in bytes or units, not {budget!r}"
        )
    link = None if offload is None else host_link(offload)
    inputs = positional_inputs(example_inputs, PlanError)
    kwargs = dict(example_kwargs or {})
    with call_deadline(time_limit, PlanError) as deadline:
        options = StepOptions(kwargs, blocks, regions, loss_fn, target, world_size, fsdp)
        step = record_step(model, inputs, options, deadline, time_limit)
        if link is not None and step.policy is not None:
            raise PlanError(
                "offload= estimates one process's step: leave it out with world_size > 1"
            )
        device = step.device
        rounding = device.rounding if device is not None else 1
        static, _ = predicted_static(model, inputs, kwargs, optimizer, rounding)
        grads, head = _grad_groups(step, inputs, kwargs, loss_fn, rounding)
        if step.policy is not None:
            memory = step.memory()
            usable = device.usable(step.policy.nccl_communicators) if device else _machine_memory()
        else:
            memory = plain_memory(static.parameters, static.optimizer_state, grads)
            usable = device.usable(0) if device is not None else _machine_memory()
        if budget is not None:
            usable = Budget.of(budget).bytes()
        if device is not None:
            plain = predicted_step_seconds(model, inputs, kwargs, loss_fn, device)
        else:
            plain = measured_step_seconds(model, inputs, kwargs, loss_fn)
        basis = _Basis(memory, static.buffers + static.inputs, head, plain)

        def row(name: str, plan: UnionPlan) -> StrategyEstimate:
            return _row(name, step, plan, basis)

        rows = [row(p, policy_plan(step.union, p)) for p in POLICIES]
        rows.append(
            StrategyEstimate(
                "torch.compile", None, "", 0.0, 0.0, "not predicted", note=COMPILE_NOTE
            )
        )
        # the step's budget: what the resident bytes leave (the sharded solve adds them itself)
        step_budget = usable - basis.other - (0 if step.policy is not None else memory.resident)
        rows.append(_solved("remat", step, step_budget, deadline, None, row))
        if link is not None:
            rows.append(_solved("remat + offload", step, step_budget, deadline, link, row))
    tokens, samples = _tokens(inputs, kwargs)
    return StepEstimate(
        tuple(rows),
        usable,
        None if device is None else device.name,
        1 if step.policy is None else step.policy.world_size,
        plain,
        tokens,
        samples,
        "measured recording" if device is None else "predicted",
    )
