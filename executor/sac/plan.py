"""Exact selective-checkpoint plans that run inside `torch.utils.checkpoint`.

    plan = executor.checkpoint_plan(model, (x,), "50%")   # record, solve (solver.sac)
    plan.apply(model)                                     # checkpoint(use_reentrant=False, SAC)
    plan.save("plan.json"); executor.CheckpointPlan.load("plan.json", model)

`checkpoint_plan` steps:
1. `_run_eagerly`: one plain step, so a model that fails with the inputs fails with its own error;
2. `select_blocks`: the blocks (executor/sac/blocks.py), and `_children`: each block's children;
3. `record_union`: measured windows, op streams, checkpoint price and SAC overhead of both
   (executor/sac/record.py);
4. `solve_sac`: the least recompute seconds plus price and overhead under the budget over every
   granularity (solver/sac/solve.py, solver/sac/union.py); with `offload=` a host link, each
   saved op may wait on the host instead (NOTE [ SAC offload model ], executor/sac/offload.py).
docs/sac.md gives the memory model and its measured accuracy.

NOTE [ SAC plans under compile ]: while torch.compile traces a block (dynamo's fake-tensor runs,
AOTAutograd's joint trace), the policy sees traced ops, not eager's dispatched stream (views
differ, dropout is functional), so positions mean nothing there. It then marks the plan's
MUST_SAVE ops by op and occurrence among ops of that name (SAC's own cache key) and every other
op MUST_RECOMPUTE, which the min-cut partitioner honours; the op-stream check runs eagerly only.
"""

from __future__ import annotations

import hashlib
import json
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from executor.errors import PlanError
from executor.fsdp import model_memory, resolve_policy, sharded_world_size
from executor.loss import default_loss
from executor.sac.blocks import select_blocks
from executor.sac.measurer import Measured
from executor.sac.offload import SavedOnHost
from executor.sac.overhead import measure_offload_seconds
from executor.sac.policy import Policy
from executor.sac.record import RECORDING_STEPS, record_union
from executor.sac.region import cache_off, run_checkpointed
from executor.sac.sharded import solve_sharded
from executor.sac.step import RecordingTime, Snapshot, in_call_order, leaf_tensors
from graph_capture.inputs import positional_inputs
from solver.core.budget import USABLE, Budget, plain_step
from solver.core.link import Link
from solver.errors import ScheduleMismatchError
from solver.interrupt import call_deadline
from solver.sac.solve import solve_sac
from solver.sac.union import SacUnion, UnionPlan
from solver.target import Device, FsdpPolicy
from solver.target.devices import host_link

__all__ = ["REGIONS", "CheckpointPlan", "checkpoint_plan"]

FORMAT = "remat-sac-plan/6"
READS = ("remat-sac-plan/5", FORMAT)
"""The plan formats `CheckpointPlan.load` reads: 6 adds the offload choices and the link; a
format 5 file offloads nothing."""


def model_signature(model: nn.Module) -> str:
    """A digest of the model's class and its parameters' names, shapes and dtypes."""
    text = repr(
        (
            type(model).__name__,
            [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()],
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _checkpointed_forward(module: nn.Module, *args, **kwargs):
    """A planned block's `forward`: its class's forward inside `checkpoint(use_reentrant=False)`
    with the block's policy (`executor.sac.region.run_checkpointed`: the KV cache off, the
    recompute seeing the call's containers, the buffers its forward mutates restored around
    the recompute). A region that saves no op runs without a policy (plain checkpoint: no
    dispatch modes, no op-stream check, the same recompute and early stop), except while
    torch.compile traces it, where the policy marks every op MUST_RECOMPUTE for the
    partitioner; so does a region in eval mode (its op stream is training mode's in the plan:
    BatchNorm and dropout dispatch other ops in eval). Without grad (`torch.no_grad`,
    `torch.inference_mode`) there is no backward: the plain forward runs. Bound to the module
    (`types.MethodType`), so a deep copy of the model runs the copy's own forward and
    policy."""
    forward = type(module).forward.__get__(module)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    policy: Policy = module.remat_sac_policy
    args, kwargs = cache_off(module, args, kwargs)
    planned = module.training and (policy.saved or torch.compiler.is_compiling())
    return run_checkpointed(
        module, args, kwargs, policy if planned else None, module.remat_sac_buffers
    )


@torch.compiler.disable
def _offloading_forward(module: nn.Module, *args, **kwargs):
    """A region's `forward` where it is not checkpointed and its saved storages wait on the host
    (NOTE [ SAC offload model ]): its class's forward under `SavedOnHost`'s
    `saved_tensors_hooks`, HF's KV cache off as in the recording (`cache_off`); without grad
    or in eval mode, the plain forward. torch.compile leaves it out of its graphs
    (`torch.compiler.disable`: dynamo does not trace saved-tensor hooks): it runs eagerly,
    hooks and all, between the compiled pieces (docs/sac.md, "Offload")."""
    forward = type(module).forward.__get__(module)
    if not torch.is_grad_enabled() or not module.training:
        return forward(*args, **kwargs)
    args, kwargs = cache_off(module, args, kwargs)
    existing = [*module.parameters(), *module.buffers(), *leaf_tensors((args, kwargs))]
    saved = SavedOnHost(existing)
    with saved.hooks():
        out = forward(*args, **kwargs)
    saved.forward_done(out)
    return out


@dataclass(frozen=True)
class CheckpointPlan:
    """A solved SAC plan. `model_signature`: a digest of the model it was solved for
    (`model_signature`); `regions`: its candidate regions (module names) in order, each block
    followed by its children where it can be split (at most one of a block and its children
    is checkpointed); per region, `region_types` (class names), `ops` (the recorded op stream),
    `checkpointed` (whether it runs inside a checkpoint) and `saved` (the op positions it saves
    rather than recomputes). `peak`: predicted step peak (bytes above what exists before the
    step); `cost`: seconds, the recompute (measured per op) plus each region's checkpoint price
    (measured per region) plus the SAC overhead of each region saving an op (measured per
    region; a region saving nothing runs as plain checkpoint); `bound`: proven lower bound on
    the cost; `gap`: (cost - bound) / cost; `status`: "OPTIMAL" or "FEASIBLE"; `budget`:
    bytes; `plain_peak`: the peak of the step without checkpointing (100%; `plain_step` names
    it: measured, or predicted in estimate mode). `target`:
    None where bytes and seconds were measured here; in estimate mode the target device's
    name, and `plain_peak` and every second are predicted for it (executor/sac/estimate.py).
    `world_size` > 1: sharded by FSDP2, and `peak`, `budget`, `plain_peak` are bytes per rank
    on the device (resident included: docs/sac.md, "Under FSDP2"). `link`: the host link the
    plan was solved with (None: it offloads nothing); `offloaded`: per region, the saved op
    positions whose outputs wait on the host between the forward and the recompute (None:
    none); `plain_offloaded`: per region, whether it is not checkpointed and the storages its
    ops create that autograd saves wait on the host (None: none); `host`: the bytes those host
    copies hold at their most (predicted); `cost` then includes the copies' stall, predicted
    from the link (docs/sac.md, "Offload")."""

    model_signature: str
    regions: tuple[str, ...]
    region_types: tuple[str, ...]
    ops: tuple[tuple[str, ...], ...]
    checkpointed: tuple[bool, ...]
    saved: tuple[frozenset[int], ...]
    status: str
    peak: int
    cost: float
    bound: float
    gap: float
    budget: int
    plain_peak: int
    problem: SacUnion
    target: str | None = None
    world_size: int = 1
    link: Link | None = None
    offloaded: tuple[frozenset[int], ...] | None = None
    host: int = 0
    plain_offloaded: tuple[bool, ...] | None = None

    def plain_offloads(self) -> tuple[bool, ...]:
        """Per region, whether it offloads its saved storages while not checkpointed."""
        return self.plain_offloaded or (False,) * len(self.regions)

    def offloads(self) -> tuple[frozenset[int], ...]:
        """Per region, the offloaded op positions (empty where the plan offloads nothing)."""
        return self.offloaded or (frozenset(),) * len(self.regions)

    @property
    def plain_step(self) -> str:
        """The name of 100%: "the measured plain step", or "the predicted plain step" in
        estimate mode."""
        return plain_step("measured" if self.target is None else "predicted")

    def checkpointed_regions(self) -> list[str]:
        """Names of the regions that run inside a checkpoint."""
        return [n for n, c in zip(self.regions, self.checkpointed, strict=True) if c]

    def __repr__(self) -> str:
        """One line: status, regions checkpointed and saving ops, peak against budget, cost."""
        checkpointed = self.checkpointed_regions()
        saving = sum(1 for c, s in zip(self.checkpointed, self.saved, strict=True) if c and s)
        basis = "measured" if self.target is None else f"predicted for {self.target}"
        if self.world_size > 1:
            basis += f", per rank of {self.world_size}"
        if self.link is not None:
            ops = sum(len(o) for o in self.offloads())
            plain = sum(self.plain_offloads())
            basis += f", {ops} ops and {plain} regions offloaded, host {self.host:,} B"
        return (
            f"CheckpointPlan({self.status}, {len(checkpointed)} of {len(self.regions)} regions "
            f"checkpointed ({saving} saving ops), peak {self.peak:,} B of budget "
            f"{self.budget:,} B ({self.plain_step} {self.plain_peak:,} B), cost {self.cost:.6f} s, "
            f"gap {self.gap:.2%}, {basis})"
        )

    def check_model(self, model: nn.Module) -> None:
        """ScheduleMismatchError unless `model` is the model this plan was solved for."""
        if model_signature(model) != self.model_signature:
            raise ScheduleMismatchError(
                f"this SAC plan was solved for another model (parameters differ from "
                f"{type(model).__name__}'s): solve a plan for this model"
            )
        modules = dict(model.named_modules())
        for name, kind in zip(self.regions, self.region_types, strict=True):
            if name not in modules or type(modules[name]).__name__ != kind:
                raise ScheduleMismatchError(
                    f"the SAC plan's region {name} ({kind}) is not a module of this model: "
                    "the plan was solved for other modules; solve one for these"
                )

    def apply(self, model: nn.Module) -> nn.Module:
        """Wrap each checkpointed block's `forward` (its class's) in `torch.utils.checkpoint(
        use_reentrant=False)` with its SAC policy (module hooks, FSDP2's included, stay
        outside); in place, returns `model`. A deep copy of the model keeps the plan. The
        buffers each region's forward mutates (recorded with the plan) are restored around its
        recompute, so the step updates them once."""
        self.check_model(model)
        modules = dict(model.named_modules())
        regions = self.problem.regions()
        for j, name in enumerate(self.regions):
            module = modules[name]
            if hasattr(module, "remat_sac_policy") or hasattr(module, "remat_sac_offload"):
                raise PlanError(f"block {name} already runs under a SAC plan: apply it once")
            if self.plain_offloads()[j]:
                module.remat_sac_offload = name
                module.forward = types.MethodType(_offloading_forward, module)
            if not self.checkpointed[j]:
                continue
            module.remat_sac_policy = Policy(name, self.ops[j], self.saved[j], self.offloads()[j])
            module.remat_sac_buffers = regions[j].buffers
            module.forward = types.MethodType(_checkpointed_forward, module)
        return model

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON."""
        data = {
            "format": FORMAT,
            "model_signature": self.model_signature,
            "regions": [
                {
                    "name": n,
                    "type": t,
                    "checkpointed": c,
                    "saved": sorted(s),
                    "offloaded": sorted(f),
                    "plain_offloaded": p,
                    "ops": list(o),
                }
                for n, t, c, s, f, p, o in zip(
                    self.regions,
                    self.region_types,
                    self.checkpointed,
                    self.saved,
                    self.offloads(),
                    self.plain_offloads(),
                    self.ops,
                    strict=True,
                )
            ],
            "link": None if self.link is None else self.link.to_json(),
            "host": self.host,
            **{k: getattr(self, k) for k in ("status", "peak", "cost", "bound", "gap")},
            **{k: getattr(self, k) for k in ("budget", "plain_peak", "target", "world_size")},
            "problem": self.problem.to_json(),
        }
        Path(path).write_text(json.dumps(data))

    @classmethod
    def load(cls, path: str | Path, model: nn.Module) -> CheckpointPlan:
        """Read a plan written by `save` (format 6, or 5: offloading nothing), checked against
        `model` (ScheduleMismatchError for a plan of another model or other blocks, ValueError
        for a file that is not a plan)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise PlanError(f"{path} is not a SAC plan file ({e}): write one with plan.save") from e
        found = data.get("format") if isinstance(data, dict) else None
        if isinstance(found, str) and found.startswith("remat-sac-plan/") and found not in READS:
            raise PlanError(
                f"{path} is a SAC plan of format {found!r}, not {FORMAT!r} (its problem lacks "
                "what this version records, or names it otherwise): solve it again with "
                "checkpoint_plan"
            )
        try:
            if found not in READS:
                raise PlanError(f"format {data.get('format')!r}, not {FORMAT!r}")
            regions = data["regions"]
            link = data.get("link")
            offloaded = tuple(frozenset(r.get("offloaded", ())) for r in regions)
            plain = tuple(bool(r.get("plain_offloaded", False)) for r in regions)
            plan = cls(
                model_signature=data["model_signature"],
                regions=tuple(r["name"] for r in regions),
                region_types=tuple(r["type"] for r in regions),
                ops=tuple(tuple(r["ops"]) for r in regions),
                checkpointed=tuple(bool(r["checkpointed"]) for r in regions),
                saved=tuple(frozenset(r["saved"]) for r in regions),
                **{k: data[k] for k in ("status", "peak", "cost", "bound", "gap")},
                **{k: data[k] for k in ("budget", "plain_peak")},
                problem=SacUnion.from_json(data["problem"]),
                target=data.get("target"),
                world_size=int(data.get("world_size", 1)),
                link=None if link is None else Link.from_json(link),
                offloaded=offloaded if any(offloaded) else None,
                host=int(data.get("host", 0)),
                plain_offloaded=plain if any(plain) else None,
            )
            if (plan.offloaded is not None or any(plain)) and plan.link is None:
                raise PlanError("it offloads ops but has no link")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PlanError(f"{path} is not a SAC plan file ({e}): write one with plan.save") from e
        plan.check_model(model)
        return plan


def _run_eagerly(model: nn.Module, step: Callable[[], torch.Tensor]) -> None:
    """One plain step (forward, loss, backward), leaving RNG, buffers and `.grad` as found: a
    model that fails with the example inputs raises its own error here."""
    snapshot = Snapshot(model)
    try:
        step().backward()
    finally:
        snapshot.restore()


def _check_device(model: nn.Module, inputs: object, estimate: bool) -> None:
    """PlanError unless the model's parameters and buffers and the inputs are on the CPU (or,
    in estimate mode, the meta device): the recording measures bytes from the CPU allocator's
    profiler events, seconds by wall clock and replays the CPU generator, none of which sees a
    device's work; estimate mode runs fake CPU tensors."""
    tensors = [*model.parameters(), *model.buffers(), *leaf_tensors(inputs)]
    allowed = ("cpu", "meta") if estimate else ("cpu",)
    devices = sorted({str(t.device) for t in tensors if t.device.type not in allowed})
    if devices:
        raise PlanError(
            f"checkpoint_plan records on the CPU only (or the meta device with a target), and "
            f"the model or its inputs are on {', '.join(devices)}: measuring a device's bytes, "
            "seconds and RNG is not supported; solve the plan with the model and inputs on "
            "the CPU, or on the meta device with target= the device (estimate mode)"
        )


def _measurer(target: str | Device | None) -> Measured:
    """`Measured` without a target; `Estimate` for a device name, device file or `Device`
    (`UnknownTargetError` for another)."""
    if target is None:
        return Measured()
    from executor.sac.estimate import Estimate
    from graph_capture.measurement.roofline import resolve_target

    return Estimate(resolve_target(target))


def _check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"world_size must be a positive integer, not {world_size!r}")


REGIONS = ("choose", "blocks", "children")
"""The candidate regions `checkpoint_plan` solves over (its `regions` argument)."""


def checkpoint_plan(
    model: nn.Module,
    example_inputs: Sequence[object] | torch.Tensor,
    budget: str | int | float | None,
    *,
    example_kwargs: Mapping[str, object] | None = None,
    blocks: Sequence[str] | None = None,
    regions: str = "choose",
    time_limit: float = 60,
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
    target: str | Device | None = None,
    world_size: int = 1,
    fsdp: FsdpPolicy | None = None,
    offload: Link | str | None = None,
) -> CheckpointPlan:
    """The SAC plan of least cost (recompute seconds plus checkpoint's price per region plus SAC
    overhead) for one training step of `model` on the example inputs
    (`loss_fn(model(*example_inputs, **example_kwargs)).backward()`; `example_inputs`: a tuple
    or list, or one tensor) whose predicted peak is at most `budget`
    (`solver.core.budget.Budget`): bytes, units ("512MiB"), a percentage of the step without
    checkpointing ("50%") or "min" (the least peak of any plan, then the least cost at it).
    `blocks`: module names or glob patterns of the blocks, run once each per step, in sequence
    (default: the model's repeated blocks).
    `regions`: "choose" (per block: no region, the whole block, or some of its children; one
    exact solve over all of these), "blocks" (whole blocks only) or "children" (children only,
    where a block's children run once each in sequence; a block with fewer than two children,
    or whose children do not, stays whole). `time_limit`: seconds for the whole call, the
    recording and the solve: the recording repeats its measurements (op times thrice, region
    prices five times) only within half of it, the solve gets what is left; PlanError where the
    recording, each measurement run once, does not finish within it (naming what it recorded
    and about how long it needs). InfeasibleBudgetError names the least budget when none
    fits. `target`: None measures a real step here; a device name (`solver.target`), a
    device file or a `Device` plans in estimate mode (executor/sac/estimate.py): no real step
    runs, the model may be on the meta device, bytes and seconds (and `plain_peak`) are
    predicted for the target, and `plan.target` names it. `world_size` > 1 (or `fsdp`, a
    `solver.target.FsdpPolicy`, NOTE [ one FSDP policy ] in executor/fsdp.py): the model is
    sharded by FSDP2 (`fully_shard` on each block and at the root; without `fsdp`, the policy
    `executor.fsdp_policy` makes for the target, the model's dtype gathered); `budget` is then the
    device memory per rank (a percentage: of the per-rank peak without checkpointing; None:
    what the target lets PyTorch allocate, `solver.target.Device.usable`: its capacity less
    the process's memory outside PyTorch, NCCL's included), and `plan.peak`, `plan.budget`,
    `plan.plain_peak` are per rank (docs/sac.md, "Under FSDP2"). `offload`: a host link
    (`solver.Link`: bytes per second each way, `host_memory` bytes), a name of
    `solver.target.HOST_LINKS` or a built-in target (its host link); the plan may then also
    offload saved ops of checkpointed regions to the host until the recompute, and park the
    saved tensors of regions it does not checkpoint until their backward (NOTE [ SAC offload
    model ], docs/sac.md "Offload"): the least cost with the copies' time predicted from the
    link, the host copies within `host_memory`; None: keep or recompute only. PlanError (one
    line) for a model allocating real memory or with data-dependent shapes in estimate mode;
    `solver.target.UnknownTargetError` for an unknown target. Ctrl-C (from the main thread,
    where SIGINT has Python's default handler): the first ends the call as the time limit
    does (the best plan the solve has, or PlanError during the recording), a second raises
    KeyboardInterrupt."""
    if regions not in REGIONS:
        raise PlanError(f"regions must be one of {REGIONS}, not {regions!r}")
    _check_world_size(world_size)
    world_size = sharded_world_size(world_size, fsdp)
    sharded = world_size > 1 or fsdp is not None
    link = _link(offload)
    if link is not None and sharded:
        raise PlanError(
            "offload= plans one process's step, not a sharded one: leave offload out with "
            "world_size > 1 or fsdp"
        )
    wanted = Budget.of(budget)  # an unreadable budget fails before any recording
    example_inputs = positional_inputs(example_inputs, PlanError)
    kwargs = dict(example_kwargs or {})
    measurer = _measurer(target)
    device = getattr(measurer, "device", None)
    if wanted.kind == USABLE and not (sharded and device is not None):
        raise PlanError(
            "budget None is a target's usable memory per rank, for a sharded plan (a target "
            "and world_size > 1): give bytes, units, a percentage or 'min'"
        )
    policy = resolve_policy(model, world_size, fsdp, device) if sharded else None
    _check_device(model, (example_inputs, kwargs), measurer.target is not None)
    with call_deadline(time_limit, PlanError) as deadline:
        sets = 1 if regions == "blocks" else 2  # the blocks, and their children
        clock = RecordingTime(
            time_limit,
            deadline,
            deadline.share(0.5),
            sum(RECORDING_STEPS[k] for k in ("eager", "windows", "order"))
            + sets * sum(RECORDING_STEPS[k] for k in ("ops", "prices")),
        )

        with measurer.running(model, (example_inputs, kwargs)) as (inputs, kw):

            def step() -> torch.Tensor:
                return loss_fn(model(*inputs, **kw))

            if measurer.runs_warmup:
                _run_eagerly(model, step)
            clock.finished("a plain step", RECORDING_STEPS["eager"])
            selected = select_blocks(model, blocks)
            kids = [] if regions == "blocks" else _kids(selected)
            order = in_call_order(model, selected + kids, step)
            blocks_ = {
                id(pair) for pair in selected
            }  # the pairs themselves: a child may be a block
            named = [pair for pair in order if id(pair) in blocks_]
            children = [None] * len(named) if regions == "blocks" else _children(named, order)
            clock.finished("the call order", RECORDING_STEPS["order"])
            union, kept = record_union(model, named, children, step, clock=clock, measurer=measurer)
        whole = regions != "children"
        if policy is None:
            if link is not None:
                seconds = measure_offload_seconds()
                union = replace(union, blocks=replace(union.blocks, offload_seconds=seconds))
            solution = solve_sac(union, wanted, deadline, whole=whole, link=link)
            plan = _plan(model, named, kept, union, solution, measurer.target, union.plain_peak)
            return plan if link is None else replace(plan, link=link, host=solution.host)
        memory = model_memory(model, [m for _, m in named], policy)
        done = solve_sharded(
            union, memory, wanted, device, deadline, whole, policy.nccl_communicators
        )
        plan = _plan(model, named, kept, union, done.solution, measurer.target, done.plain_peak)
        return replace(plan, world_size=policy.world_size)


def _link(offload: Link | str | None) -> Link | None:
    """The host link `offload=` names (None: none); PlanError for anything else."""
    if offload is None:
        return None
    if not isinstance(offload, Link | str):
        raise PlanError(
            f"offload must be a solver.Link, a host link or target name, or None, not {offload!r}"
        )
    return host_link(offload)


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
