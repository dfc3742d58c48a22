"""One training step of a model recorded for SAC (`record_step` -> `RecordedStep`): the plain
step run once eagerly (a model that fails with its inputs fails with its own error), the blocks
and their children chosen, and `record_union` run on the device the model is on (measured) or
for a target (estimate mode); the recording then solves (`RecordedStep.solve`) or evaluates a
fixed plan (`RecordedStep.fixed`) into a `CheckpointPlan`. `checkpoint_plan`
(executor/sac/planning.py) and `executor.estimate` are built on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from executor.errors import PlanError
from executor.fsdp import model_memory, resolve_policy, sharded_world_size
from executor.loss import default_loss
from executor.sac.plan import CheckpointPlan, model_signature
from executor.sac.recording.blocks import select_blocks
from executor.sac.recording.measurer import DeviceMeter, Measurer
from executor.sac.recording.overhead import measure_offload_seconds
from executor.sac.recording.record import RECORDING_STEPS, record_union
from executor.sac.sharded import solve_sharded
from executor.sac.step import RecordingTime, Snapshot, in_call_order, leaf_tensors
from executor.traced.offload import link_on
from graph_capture.inputs import positional_inputs
from graph_capture.measurement.peak import CPU
from solver.core.budget import Budget
from solver.core.link import Link
from solver.deadline import Deadline
from solver.sac.solve import SacSolution, solve_sac
from solver.sac.union import SacUnion, UnionPlan, union_cost
from solver.target import Device, FsdpMemory, FsdpPolicy
from solver.time_shares import SAC_SHARES

__all__ = ["RecordedStep", "StepOptions", "record_step"]


def _run_eagerly(model: nn.Module, step: Callable[[], torch.Tensor]) -> None:
    """One plain step (forward, loss, backward), leaving RNG, buffers and `.grad` as found: a
    model that fails with the example inputs raises its own error here."""
    snapshot = Snapshot(model)
    try:
        step().backward()
    finally:
        snapshot.restore()


def _recording_device(model: nn.Module, inputs: object, estimate: bool) -> torch.device:
    """The device the recording runs on: where the model's parameters and buffers and the
    inputs are, the CPU or one CUDA device (in estimate mode, the CPU or the meta device,
    recorded as fake CPU tensors: the CPU). PlanError (one line) for any other device, and for
    tensors on more than one device."""
    tensors = [*model.parameters(), *model.buffers(), *leaf_tensors(inputs)]
    devices = sorted({str(t.device) for t in tensors})
    if estimate:
        other = [d for d in devices if torch.device(d).type not in ("cpu", "meta")]
        if other:
            raise PlanError(
                f"checkpoint_plan with a target runs fake CPU tensors, and the model or its "
                f"inputs are on {', '.join(other)}: move them to the CPU or the meta device, "
                "or leave target out to measure on the device"
            )
        return CPU
    if len(devices) > 1:
        raise PlanError(
            f"checkpoint_plan records one step on one device, and the model and its inputs "
            f"are on {', '.join(devices)}: move the model and the inputs to one device"
        )
    device = torch.device(devices[0]) if devices else CPU
    if device.type not in ("cpu", "cuda"):
        raise PlanError(
            f"checkpoint_plan measures on the CPU or a CUDA device, and the model and its "
            f"inputs are on {device}: measure on the CPU or CUDA, or on the meta device "
            "with target= the device (estimate mode)"
        )
    return device


def _measurer(target: str | Device | None, device: torch.device) -> Measurer:
    """`Measurer` on `device` without a target; `Estimate` for a device name, device file or
    `Device` (`UnknownTargetError` for another)."""
    if target is None:
        return Measurer(DeviceMeter(device))
    from executor.sac.recording.estimate import Estimate
    from graph_capture.measurement.roofline import resolve_target

    return Estimate(resolve_target(target))


def check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"world_size must be a positive integer, not {world_size!r}")


@dataclass(frozen=True)
class StepOptions:
    """What `record_step` records, as `checkpoint_plan`'s arguments of the same names."""

    example_kwargs: Mapping[str, object] | None = None
    blocks: Sequence[str] | None = None
    regions: str = "choose"
    loss_fn: Callable[[object], torch.Tensor] = default_loss
    target: str | Device | None = None
    world_size: int = 1
    fsdp: FsdpPolicy | None = None


@dataclass
class RecordedStep:
    """One recorded training step, ready to solve at any budget: the model, its blocks in call
    order (`named`) and kept children (`kept`), the recorded union, the measurer, the FSDP2
    policy (None: one process) and the time the recording took (`clock`)."""

    model: nn.Module
    named: list
    kept: list
    union: SacUnion
    measurer: Measurer
    policy: FsdpPolicy | None
    recorded_on: torch.device
    clock: RecordingTime
    whole: bool

    @property
    def device(self) -> Device | None:
        """The target device (None: measured here)."""
        return getattr(self.measurer, "device", None)

    def memory(self) -> FsdpMemory:
        """FSDP2's per-rank memory of the sharded step (`model_memory`); PlanError in one
        process."""
        if self.policy is None:
            raise PlanError("a step recorded for one process has no FSDP2 memory")
        return model_memory(self.model, [m for _, m in self.named], self.policy)

    def fixed(self, plan: UnionPlan, peak: int, budget: int, plain_peak: int) -> CheckpointPlan:
        """The `CheckpointPlan` of a plan not solved for (a fixed policy) over the recorded
        regions, with its predicted `peak` against `budget` and the step's without
        checkpointing, `plain_peak` (bytes; per rank where sharded): status "FIXED", its cost
        `union_cost`'s, bound and gap 0."""
        cost = union_cost(self.union, plan)
        solution = SacSolution(plan, peak, cost, "FIXED", cost, 0.0, budget)
        target = self.measurer.target
        out = _plan(self.model, self.named, self.kept, self.union, solution, target, plain_peak)
        return out if self.policy is None else replace(out, world_size=self.policy.world_size)

    def solve(self, wanted: Budget, deadline: Deadline, link: Link | None) -> CheckpointPlan:
        """The least-cost plan within `wanted` (per rank where sharded; `link`: one process's
        host link, offloads allowed) before `deadline`."""
        device, clock, union = self.device, self.clock, self.union
        # the host rounding of the device the plan's copies run on: the recording's, or the target's
        on = self.recorded_on if device is None else torch.device(device.kernels)
        link = link_on(link, on)
        target = self.measurer.target
        if self.policy is None:
            if link is not None:
                seconds = measure_offload_seconds(meter=self.measurer.meter)
                union = replace(union, blocks=replace(union.blocks, offload_seconds=seconds))
            with clock.solving():
                solution = solve_sac(
                    union, wanted, deadline, whole=self.whole, link=link, shares=clock.shares
                )
            plan = _plan(
                self.model, self.named, self.kept, union, solution, target, union.plain_peak
            )
            return plan if link is None else replace(plan, link=link, host_peak=solution.host_peak)
        with clock.solving():
            done = solve_sharded(
                union,
                self.memory(),
                wanted,
                device,
                deadline,
                self.whole,
                self.policy.nccl_communicators,
                clock.shares,
            )
        plan = _plan(
            self.model, self.named, self.kept, union, done.solution, target, done.plain_peak
        )
        return replace(plan, world_size=self.policy.world_size)


def record_step(
    model: nn.Module,
    example_inputs: Sequence[object] | torch.Tensor,
    options: StepOptions,
    deadline: Deadline,
    time_limit: float,
) -> RecordedStep:
    """Record one training step of `model` (`checkpoint_plan`'s recording, within half of
    `time_limit` seconds, ending by `deadline`) for solves at any budget."""
    o = options
    check_world_size(o.world_size)
    world_size = sharded_world_size(o.world_size, o.fsdp)
    sharded = world_size > 1 or o.fsdp is not None
    example_inputs = positional_inputs(example_inputs, PlanError)
    kwargs = dict(o.example_kwargs or {})
    recorded_on = _recording_device(model, (example_inputs, kwargs), o.target is not None)
    measurer = _measurer(o.target, recorded_on)
    device = getattr(measurer, "device", None)
    policy = resolve_policy(model, world_size, o.fsdp, device) if sharded else None
    sets = 1 if o.regions == "blocks" else 2  # the blocks, and their children
    clock = RecordingTime(
        time_limit,
        deadline,
        deadline.share(SAC_SHARES.recording),
        sum(RECORDING_STEPS[k] for k in ("eager", "windows", "order"))
        + sets * sum(RECORDING_STEPS[k] for k in ("ops", "prices")),
        shares=SAC_SHARES,
    )
    step = _Recording(model, (example_inputs, kwargs), o.loss_fn, measurer, clock)
    named, kept, union = step.record(o.blocks, o.regions)
    whole = o.regions != "children"
    return RecordedStep(model, named, kept, union, measurer, policy, recorded_on, clock, whole)


class _Recording:
    """`checkpoint_plan`'s recording: `model`'s training step on the example inputs
    (`loss_fn` of its output), run under `measurer` within `clock`'s share of the time."""

    def __init__(
        self,
        model: nn.Module,
        inputs: tuple[Sequence[object], dict[str, object]],
        loss_fn: Callable[[object], torch.Tensor],
        measurer: Measurer,
        clock: RecordingTime,
    ) -> None:
        self.model, self.inputs, self.loss_fn = model, inputs, loss_fn
        self.measurer, self.clock = measurer, clock

    def record(self, blocks: Sequence[str] | None, regions: str) -> tuple[list, list, SacUnion]:
        """(the blocks in call order, per block its children kept or None, the union of their
        candidate regions): `blocks` selected (`select_blocks`), and their children unless
        `regions` is "blocks", recorded."""
        model, measurer, clock = self.model, self.measurer, self.clock
        with measurer.running(model, self.inputs) as (inputs, kw):

            def step() -> torch.Tensor:
                return self.loss_fn(model(*inputs, **kw))

            if measurer.runs_warmup:
                _run_eagerly(model, step)
            clock.finished("a plain step", RECORDING_STEPS["eager"])
            named, children = _in_call_order(model, blocks, regions, step)
            clock.finished("the call order", RECORDING_STEPS["order"])
            union, kept = record_union(model, named, children, step, clock=clock, measurer=measurer)
        return named, kept, union


def _in_call_order(
    model: nn.Module,
    blocks: Sequence[str] | None,
    regions: str,
    step: Callable[[], torch.Tensor],
) -> tuple[list[tuple[str, nn.Module]], list[list[tuple[str, nn.Module]] | None]]:
    """(the blocks `blocks` selects, in the order a forward first calls them; per block its
    children in that order, None where it has fewer than two or `regions` is "blocks")."""
    selected = select_blocks(model, blocks)
    kids = [] if regions == "blocks" else _kids(selected)
    order = in_call_order(model, selected + kids, step)
    chosen = {id(pair) for pair in selected}  # the pairs themselves: a child may be a block
    named = [pair for pair in order if id(pair) in chosen]
    children = [None] * len(named) if regions == "blocks" else _children(named, order)
    return named, children


def _kids(named: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """The children of the blocks of `named`, (qualified name, module)."""
    return [(f"{name}.{c}", m) for name, block in named for c, m in block.named_children()]


def _children(
    named: list[tuple[str, nn.Module]], order: list[tuple[str, nn.Module]]
) -> list[list[tuple[str, nn.Module]] | None]:
    """Per block, its children in the order a forward first calls them (`order`: the blocks'
    and children's, from `in_call_order`), None for a block with fewer than two."""
    rank = {id(m): k for k, (_, m) in enumerate(order)}
    out: list[list[tuple[str, nn.Module]] | None] = []
    for name, block in named:
        kids = _kids([(name, block)])
        called = sorted((k for k in kids if id(k[1]) in rank), key=lambda k: rank[id(k[1])])
        out.append(called if len(kids) >= 2 else None)
    return out


def _plan(
    model: nn.Module, named, kept, union: SacUnion, solution, target: str | None, plain: int
) -> CheckpointPlan:
    """The plan's regions in order: each block, then its children where it has a split."""
    names, types_, ops, checkpointed, saved, offloaded, parked = [], [], [], [], [], [], []
    plan: UnionPlan = solution.plan
    for j, (name, module) in enumerate(named):
        block = union.blocks.blocks[j]
        names.append(name)
        types_.append(type(module).__name__)
        ops.append(tuple(op.name for op in block.ops))
        checkpointed.append(plan.blocks.checkpointed[j])
        saved.append(plan.blocks.saved[j])
        offloaded.append(plan.blocks.offloads()[j])
        parked.append(plan.blocks.plain_offloads()[j])
        if kept[j] is None:
            continue
        split, sub = union.splits[j], plan.children[j]
        for (kid, m), child, c, s, o, q in zip(
            kept[j],
            split.children,
            sub.checkpointed,
            sub.saved,
            sub.offloads(),
            sub.plain_offloads(),
            strict=True,
        ):
            names.append(kid)
            types_.append(type(m).__name__)
            ops.append(tuple(op.name for op in child.ops))
            checkpointed.append(c)
            saved.append(s)
            offloaded.append(o)
            parked.append(q)
    return CheckpointPlan(
        model_signature=model_signature(model),
        regions=tuple(names),
        region_types=tuple(types_),
        ops=tuple(ops),
        checkpointed=tuple(checkpointed),
        saved=tuple(saved),
        status=solution.status,
        peak=solution.peak,
        cost=solution.cost,
        bound=solution.bound,
        gap=solution.gap,
        budget=solution.budget,
        plain_peak=plain,
        problem=union,
        target=target,
        offloaded=tuple(offloaded) if any(offloaded) else None,
        plain_offloaded=tuple(parked) if any(parked) else None,
    )
