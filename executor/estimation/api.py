"""`estimate`: will a training step fit, and how fast, under every checkpointing strategy.

    est = executor.estimate(model, (ids,), example_kwargs={"labels": ids}, target="h100",
                            world_size=8)
    print(est.to_markdown()); est.plot("strategies.png"); est.fits("h100")

One recording of the step (`executor.sac.recorded_step.record_step`: estimate mode for a target,
measured here without one) is solved and evaluated for each strategy (`STRATEGIES`); every
row's bytes are the same per-rank model (`solver.target.components.peak_components`), its
seconds the plain step's plus what the strategy adds (`solver.sac.union.union_cost`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from executor.errors import PlanError
from executor.estimation.grad_groups import grad_groups
from executor.estimation.largest import largest_sizes
from executor.estimation.replans import replans
from executor.estimation.report import StepEstimate, StrategyEstimate
from executor.estimation.reserved import LoggedStep, log_step, predict_reserved
from executor.estimation.settings import EstimateSettings
from executor.estimation.step_seconds import measured_step_seconds, predicted_step_seconds
from executor.fitting.memory import predicted_static
from executor.loss import default_loss
from executor.sac.plan import CheckpointPlan
from executor.sac.recorded_step import RecordedStep, StepOptions, record_step
from graph_capture.inputs import positional_inputs
from solver.core.budget import BYTES, Budget
from solver.core.link import Link
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, SolverTimeoutError
from solver.interrupt import call_deadline
from solver.sac.policies import POLICIES, policy_plan, sac_overhead
from solver.sac.sharded import plan_windows
from solver.sac.union import UnionPlan, union_cost
from solver.spelling import spelled
from solver.target import Device, FsdpMemory, FsdpPolicy
from solver.target.caching_allocator import AllocatorConfig
from solver.target.components import latest_peak, peak_components, plain_memory
from solver.target.devices import host_link
from solver.time_shares import ESTIMATE_SHARES

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


def environment_alloc_conf() -> str:
    """The caching allocator's settings this process's torch reads: ``PYTORCH_ALLOC_CONF``,
    else ``PYTORCH_CUDA_ALLOC_CONF``, else "" (torch's defaults)."""
    return os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))


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


@dataclass(frozen=True)
class _Rows:
    """Makes the rows of one recorded step: the per-rank model (`memory`), bytes outside the
    model (`other`) and of the head's gradients (`head_grads`, `peak_components`), the plain
    step's seconds and the memory each row is judged against (`usable`, bytes per rank)."""

    step: RecordedStep
    memory: FsdpMemory
    other: int
    head_grads: int
    plain: float
    usable: int

    def fixed(self, name: str) -> StrategyEstimate:
        """The row of a fixed policy (`solver.sac.policies.POLICIES`)."""
        plan = policy_plan(self.step.union, name)
        row = self.evaluated(name, plan)
        none = self.evaluated("none", policy_plan(self.step.union, "none"))
        assert row.components is not None and none.components is not None
        resident = 0 if self.step.policy is not None else self.memory.resident + self.other
        checkpoint = self.step.fixed(
            plan,
            row.components.total - self.other - resident,
            self.usable - self.other - resident,
            none.components.total - self.other - resident,
        )
        overhead = sac_overhead(self.step.union, plan)
        note = f"SAC overhead {overhead:.3g} s of it" if overhead else ""
        return replace(row, plan=checkpoint, note=note)

    def evaluated(self, name: str, plan: UnionPlan, cost: float | None = None) -> StrategyEstimate:
        """The row of `plan` over the recorded union; `cost`: what it adds to the step
        (seconds; default `union_cost`)."""
        windows = plan_windows(self.step.union, plan)
        components = peak_components(self.memory, windows, self.other, self.head_grads)
        moment, _ = latest_peak(self.memory, windows)
        recompute = union_cost(self.step.union, plan) if cost is None else cost
        largest = {w: (what, b) for w, what, b in self.step.union.blocks.largest}
        what, nbytes = largest.get(moment.window, ("", 0))
        return StrategyEstimate(
            name,
            components,
            f"{moment.window}, {moment.level}",
            recompute,
            self.plain + recompute,
            "FIXED",
            bottleneck=what,
            bottleneck_bytes=nbytes,
        )

    def solved(
        self, name: str, deadline: Deadline, link: Link | None, within: int | None = None
    ) -> StrategyEstimate:
        """remat's row: the least-cost plan within `within` bytes per rank (default `usable`;
        with `link`: offloads allowed); where none fits, an "INFEASIBLE" row with the least
        peak (the solve's proof) and where the least-peak plan peaks, or "NONE FOUND" where the
        solve found none in its time."""
        resident = 0 if self.step.policy is not None else self.memory.resident
        none = self.evaluated("none", policy_plan(self.step.union, "none")).total
        assert none is not None
        # above the step without checkpointing nothing is to be saved: solved at that peak,
        # CP-SAT's numbers stay those of the step (a CPU target's memory is 2^62 bytes)
        limit = self.usable if within is None else within
        budget = Budget.of(min(limit, none) - self.other - resident)
        try:
            plan: CheckpointPlan = self.step.solve(budget, deadline, link)
        except InfeasibleBudgetError as e:
            least = None if e.minimum_bytes is None else e.minimum_bytes + self.other + resident
            row = StrategyEstimate(name, None, "", 0.0, 0.0, "INFEASIBLE", least=least,
                                   note="no plan fits")  # fmt: skip
            if e.least_plan is None:
                return row
            floor = self.evaluated(name, e.least_plan)  # where the least-peak plan peaks
            return replace(row, peak_at=floor.peak_at, bottleneck=floor.bottleneck,
                           bottleneck_bytes=floor.bottleneck_bytes)  # fmt: skip
        except (PlanError, SolverTimeoutError) as e:
            return StrategyEstimate(name, None, "", 0.0, 0.0, "NONE FOUND", note=str(e))
        row = self.evaluated(name, plan.union_plan(), plan.cost)
        status = f"{plan.status} gap {plan.gap:.2%}"
        return replace(row, status=status, host_bytes=plan.host_peak, plan=plan)


def _rows(
    step: RecordedStep,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    optimizer: str,
    budget: str | int | None,
) -> _Rows:
    """The row maker of a recorded step: its per-rank model (FSDP2's, or one process's from
    the static bytes and the gradient groups), the plain step's seconds (predicted for the
    target, measured here without one) and the memory per rank (`budget`, or the device's)."""
    model, device = step.model, step.device
    rounding = device.rounding if device is not None else 1
    static, _ = predicted_static(model, inputs, kwargs, optimizer, rounding)
    with step.measurer.running(model, (list(inputs), dict(kwargs))) as (args, kw):
        groups = grad_groups(model, step.named, lambda: loss_fn(model(*args, **kw)))
    if step.policy is not None:
        memory = step.memory()
        communicators = step.policy.nccl_communicators
    else:
        grads = groups.block_bytes(rounding)
        memory = plain_memory(static.parameters, static.optimizer_state, grads)
        communicators = 0
    if budget is not None:
        usable = Budget.of(budget).bytes()
    else:
        usable = _machine_memory() if device is None else device.usable(communicators)
    if device is not None:
        plain = predicted_step_seconds(model, inputs, kwargs, loss_fn, device)
    else:
        plain = measured_step_seconds(model, inputs, kwargs, loss_fn)
    other = static.buffers + static.inputs
    return _Rows(step, memory, other, groups.head_bytes(rounding), plain, usable)


def _estimate_at(
    model: nn.Module,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    settings: EstimateSettings,
    deadline: Deadline,
    deciding: bool = False,
) -> StepEstimate:
    """Every strategy's row for one step of `model` on the inputs, by `deadline`. `deciding`
    (a size of the largest-size search): remat's rows only say whether a plan fits: where a
    fixed policy's row fits, that row (remat's plans include it); else the solve, for
    `EstimateShares.deciding` times the recording's seconds."""
    s = settings
    start = time.perf_counter()
    options = StepOptions(kwargs, s.blocks, s.regions, s.loss_fn, s.target, s.world_size, s.fsdp)
    step = record_step(model, inputs, options, deadline, deadline.remaining())
    make = _rows(step, inputs, kwargs, s.loss_fn, s.optimizer, s.budget)
    rows = [make.fixed(p) for p in POLICIES]
    fitting = sorted(
        (r for r in rows if r.total is not None and r.total <= make.usable), key=lambda r: r.seconds
    )
    by = deadline.within(ESTIMATE_SHARES.deciding * (time.perf_counter() - start))

    def remat(name: str, link: Link | None) -> StrategyEstimate:
        if not deciding:
            return make.solved(name, deadline, link)
        if fitting:
            return replace(fitting[0], name=name, note=f"{fitting[0].name}'s plan fits")
        given = by.remaining()
        row = make.solved(name, by, link)
        if row.status != "NONE FOUND":
            return row
        return replace(row, note=f"no plan found in the {given:.0f} s a size's solve is given")

    rows.append(
        StrategyEstimate("torch.compile", None, "", 0.0, 0.0, "NOT PREDICTED", note=COMPILE_NOTE)
    )
    rows.append(remat("remat", None))
    if s.link is not None:
        rows.append(remat("remat + offload", s.link))
    reserved_note = _reserved_note(step)
    if not deciding and not reserved_note:
        logged: dict[tuple, LoggedStep] = {}  # rows with the same plan run one step

        def reserve(row: StrategyEstimate) -> StrategyEstimate:
            return _with_reserved(row, step, inputs, kwargs, s, make.usable, logged)

        rows = [reserve(r) for r in rows]
        rows = [_leaving_room(r, make, deadline, reserve) if r.name == "remat" else r for r in rows]
    tokens, samples = _tokens(inputs, kwargs)
    device = step.device
    return StepEstimate(
        tuple(rows),
        make.usable,
        None if device is None else device.name,
        1 if step.policy is None else step.policy.world_size,
        make.plain,
        tokens,
        samples,
        "measured recording" if device is None else "predicted",
        reserved_note=reserved_note,
    )


RESERVE_ROUNDS = 3
"""The most re-solves `_leaving_room` makes for remat's row."""


def _leaving_room(
    row: StrategyEstimate,
    make: _Rows,
    deadline: Deadline,
    reserve: Callable[[StrategyEstimate], StrategyEstimate],
) -> StrategyEstimate:
    """remat's row whose plan fits the usable memory by allocated bytes but not by the caching
    allocator's reserved ones, re-solved within the usable memory less what its reserved bytes
    exceed it by (at most `RESERVE_ROUNDS` solves, each checked by `reserve`): the first plan
    whose reserved bytes fit, its note saying so; else the row as it was, its note saying
    that no plan found leaves the allocator room."""
    current = row
    for _ in range(RESERVE_ROUNDS):
        got = current.reserved
        if got is None or got.fits or current.total is None or deadline.passed():
            break
        within = current.total - (got.reserved - make.usable)
        tried = reserve(make.solved(row.name, deadline, None, within))
        if tried.total is None:
            break
        current = replace(
            tried, note=f"solved within {within:,} B: room for the caching allocator's reserve"
        )
    if current is row or current.reserved is None or not current.reserved.fits:
        if row.reserved is None or row.reserved.fits:
            return row
        return replace(row, note="no plan found whose reserved bytes fit the usable memory")
    return current


def _reserved_note(step: RecordedStep) -> str:
    """Why the rows' reserved bytes are not predicted ("" where they are)."""
    device = step.device
    if device is None:
        return "is predicted in estimate mode only: give target= a CUDA device"
    if device.kernels != "cuda":
        return f"is not predicted for target {device.name}: not a CUDA device"
    if step.policy is not None:
        return (
            "is not predicted under FSDP2: its all-gathers and reduce-scatters allocate on "
            "their own streams, and the allocator model is one stream's"
        )
    return ""


def _with_reserved(
    row: StrategyEstimate,
    step: RecordedStep,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    s: EstimateSettings,
    usable: int,
    logged: dict[tuple, LoggedStep],
) -> StrategyEstimate:
    """`row` with its plan's reserved bytes (`executor.estimation.reserved`); as it is where it
    has no plan, or a plan that copies to the host (its copies run on their own streams).
    `logged`: the steps logged so far, by what their plans checkpoint and save."""
    plan = row.plan
    if plan is None or row.components is None or plan.link is not None:
        return row
    key = (plan.checkpointed, plan.saved)
    if key not in logged:
        logged[key] = log_step(step.model, inputs, kwargs, s.loss_fn, step.measurer, plan)
    return replace(row, reserved=predict_reserved(logged[key], s.optimizer, s.alloc_conf, usable))


@spelled
def estimate(
    model: nn.Module,
    example_inputs: Sequence[object] | torch.Tensor,
    budget: str | int | None = None,
    *,
    example_kwargs: Mapping[str, object] | None = None,
    blocks: Sequence[str] | None = None,
    regions: str = "choose",
    time_limit: float = 120,
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
    target: str | Device | None = None,
    world_size: int = 1,
    fsdp: FsdpPolicy | None = None,
    offload: Link | str | None = None,
    optimizer: str = "adamw",
    factories: Mapping[str, Callable[[int], object]] | None = None,
    alloc_conf: str | None = None,
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
    `blocks`, `regions`, `loss_fn`: as `checkpoint_plan`'s. `factories`: per dimension
    ("batch", "seq", ...), a factory as `executor.fit`'s (`factory(size)` returns
    ``(model, example_inputs[, example_kwargs])`` at that size): each row's largest size
    along it (`StrategyEstimate.largest`, executor/estimation/largest.py), one estimate per
    size; measured sizes without a target run real steps, so give a `budget` there.
    `alloc_conf`: the CUDA caching allocator's settings each row's reserved bytes are
    predicted under (a ``PYTORCH_ALLOC_CONF`` string, such as torchtitan's
    "expandable_segments:True"; None: this process's ``PYTORCH_ALLOC_CONF`` or
    ``PYTORCH_CUDA_ALLOC_CONF``, as torch reads them, else torch's defaults).
    `time_limit`: seconds for the whole call (the recording takes at most half; each solve
    what is left; with `factories`, the example inputs' estimate and each size's at most
    `EstimateShares.first` of it, the search `EstimateShares.search` of what is left after the
    first, the re-plans the rest).

    Exception to the 8-parameter and 80-line rules: a public entry point whose keyword-only
    parameters are the one interface's options, each documented here."""
    if budget is not None and Budget.of(budget).kind != BYTES:
        raise PlanError(
            f"estimate's budget is device memory per rank in bytes or units, not {budget!r}"
        )
    link = None if offload is None else host_link(offload)
    if link is not None and (world_size > 1 or fsdp is not None):
        raise PlanError("offload= estimates one process's step: leave it out with world_size > 1")
    if factories and target is None and budget is None:
        raise PlanError(
            "factories= searches sizes until a step does not fit: measured here (no target) "
            "that means steps as large as this machine's memory; give a budget or a target"
        )
    inputs = positional_inputs(example_inputs, PlanError)
    conf = alloc_conf if alloc_conf is not None else environment_alloc_conf()
    AllocatorConfig.parse(conf)  # an ArgumentError naming the setting, before any work
    settings = EstimateSettings(
        blocks, regions, loss_fn, target, world_size, fsdp, budget, optimizer, link, conf
    )
    with call_deadline(time_limit, PlanError) as deadline:
        first = deadline.within(ESTIMATE_SHARES.first * time_limit) if factories else deadline
        est = _estimate_at(model, inputs, dict(example_kwargs or {}), settings, first)
        if not factories:
            return est

        def estimate_with(
            made: object, s: EstimateSettings, by: Deadline, deciding: bool = False
        ) -> StepEstimate:
            m, i, k = made
            within = by.within(ESTIMATE_SHARES.first * time_limit)  # as long as the first
            return _estimate_at(m, positional_inputs(i, PlanError), dict(k), s, within, deciding)

        found = largest_sizes(
            factories,
            est,
            lambda made, by: estimate_with(made, settings, by, deciding=True),
            deadline.share(ESTIMATE_SHARES.search),
        )
        remat = {d: found[d]["remat"] for d in found if "remat" in found[d]}
        # the least size remat's row is not known to fit: proven not to, or left open
        limits = {d: (v.size + 1, factories[d]) for d, v in remat.items() if v.size}
        replanned = replans(limits, settings, estimate_with, deadline)
    rows = tuple(
        replace(r, largest={d: found[d][r.name] for d in found if r.name in found[d]})
        for r in est.strategies
    )
    return replace(est, strategies=rows, replans=replanned)
