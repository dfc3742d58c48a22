"""`checkpoint_plan`: record one step of a model and solve its SAC plan (`CheckpointPlan`,
executor/sac/plan.py).

    plan = executor.checkpoint_plan(model, (x,), "50%")   # record, solve (solver.sac)

`checkpoint_plan` steps (the first three in executor/sac/recorded_step.py, `record_step`):
1. `_run_eagerly`: one plain step, so a model that fails with the inputs fails with its own error;
2. `select_blocks`: the blocks (executor/sac/recording/blocks.py), and `_children`: each
   block's children;
3. `record_union`: measured windows, op streams, checkpoint price and SAC overhead of both
   (executor/sac/recording/record.py);
4. `solve_sac` (`RecordedStep.solve`): the least recompute seconds plus price and overhead
   under the budget over every granularity (solver/sac/solve.py, solver/sac/union.py); with
   `offload=` a host link, each saved op may wait on the host instead (NOTE [ SAC offload
   model ], executor/sac/runtime/offload.py).
docs/design.md, "SAC: the memory model", gives the memory model; docs/sac.md its measured
accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from executor.errors import PlanError
from executor.fsdp import sharded_world_size
from executor.loss import default_loss
from executor.sac.plan import CheckpointPlan
from executor.sac.recorded_step import StepOptions, check_world_size, record_step
from solver.core.budget import USABLE, Budget
from solver.core.link import Link
from solver.interrupt import call_deadline
from solver.spelling import spelled
from solver.target import Device, FsdpPolicy
from solver.target.devices import host_link

__all__ = ["REGIONS", "checkpoint_plan"]


REGIONS = ("choose", "blocks", "children")
"""The candidate regions `checkpoint_plan` solves over (its `regions` argument)."""


@spelled
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
    device file or a `Device` plans in estimate mode (executor/sac/recording/estimate.py): no real
    step runs, the model may be on the meta device, bytes and seconds (and `plain_peak`) are
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
    link, the host copies within `host_memory` (each buffer rounded as the host allocator of
    the device the copies run on rounds it, `executor.traced.offload.link_on`); None: keep or
    recompute only. PlanError (one line) for a model allocating real memory or with
    data-dependent shapes in estimate mode; `solver.target.UnknownTargetError` for an unknown
    target. Ctrl-C (from the main thread,
    where SIGINT has Python's default handler): the first ends the call as the time limit
    does (the best plan the solve has, or PlanError during the recording), a second raises
    KeyboardInterrupt.

    Exception to the 8-parameter and 80-line rules: a public entry point whose keyword-only
    parameters are the one interface's options, each documented here."""
    link, world_size, sharded = _checked(regions, world_size, fsdp, offload)
    wanted = Budget.of(budget)  # an unreadable budget fails before any recording
    if wanted.kind == USABLE and not (sharded and target is not None):
        raise PlanError(
            "budget None is a target's usable memory per rank, for a sharded plan (a target "
            "and world_size > 1): give bytes, units, a percentage or 'min'"
        )
    with call_deadline(time_limit, PlanError) as deadline:
        step = record_step(
            model,
            example_inputs,
            StepOptions(example_kwargs, blocks, regions, loss_fn, target, world_size, fsdp),
            deadline,
            time_limit,
        )
        return step.solve(wanted, deadline, link)


def _checked(
    regions: str, world_size: int, fsdp: FsdpPolicy | None, offload: Link | str | None
) -> tuple[Link | None, int, bool]:
    """(the host link, the world size, whether the plan is sharded under FSDP2):
    `checkpoint_plan`'s arguments checked (PlanError where they do not go together)."""
    if regions not in REGIONS:
        raise PlanError(f"regions must be one of {REGIONS}, not {regions!r}")
    check_world_size(world_size)
    world_size = sharded_world_size(world_size, fsdp)
    sharded = world_size > 1 or fsdp is not None
    link = _link(offload)
    if link is not None and sharded:
        raise PlanError(
            "offload= plans one process's step, not a sharded one: leave offload out with "
            "world_size > 1 or fsdp"
        )
    return link, world_size, sharded


def _link(offload: Link | str | None) -> Link | None:
    """The host link `offload=` names (None: none); PlanError for anything else."""
    if offload is None:
        return None
    if not isinstance(offload, Link | str):
        raise PlanError(
            f"offload must be a solver.Link, a host link or target name, or None, not {offload!r}"
        )
    return host_link(offload)
