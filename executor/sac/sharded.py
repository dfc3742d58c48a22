"""SAC plans for a model sharded by FSDP2 over `world_size` ranks (`checkpoint_plan(...,
world_size=N)`): the solve at the rank's device memory (solver/sac/sharded.py, docs/fsdp.md),
given the model's per-rank memory (`executor.fsdp`: the policy and the groups)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from executor.errors import PlanError
from solver.core.budget import USABLE, Budget
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, InternalError
from solver.sac.memory import SacPlan
from solver.sac.sharded import rank_peak, shifted
from solver.sac.solve import SacSolution, solve_sac
from solver.sac.union import SacUnion, UnionPlan
from solver.target import Device, FsdpMemory
from solver.time_shares import SAC_SHARES, SacShares


@dataclass(frozen=True)
class ShardedSolution:
    """The solve at a rank's device memory: `solution` with `peak` and `budget` per rank
    (bytes on the device: resident plus the step), `plain_peak`: the per-rank peak without
    checkpointing, `memory`: FSDP's per-rank model."""

    solution: SacSolution
    plain_peak: int
    memory: FsdpMemory


def _no_checkpoint(union: SacUnion) -> UnionPlan:
    def none(n: int) -> SacPlan:
        return SacPlan((False,) * n, (frozenset(),) * n)

    return UnionPlan(
        none(len(union.blocks.blocks)),
        tuple(None if s is None else none(len(s.children)) for s in union.splits),
    )


def solve_sharded(
    union: SacUnion,
    memory: FsdpMemory,
    budget: Budget | str | int | float | None,
    device: Device | None,
    deadline: Deadline,
    whole: bool,
    nccl_communicators: int = 0,
    shares: SacShares = SAC_SHARES,
) -> ShardedSolution:
    """The least-cost plan whose per-rank peak fits `budget`: bytes or units of device memory
    per rank, a percentage of the per-rank peak without checkpointing, "min", or None (what
    the target lets PyTorch allocate: `Device.usable` with `nccl_communicators`). The step's
    budget is what the resident bytes leave, each window less its most FSDP bytes
    (solver/sac/sharded.py); `shares`: the solve's (`solve_sac`)."""
    plain = memory.resident + rank_peak(union, _no_checkpoint(union), memory).step_peak
    wanted = Budget.of(budget)
    usable = None if device is None else lambda: device.usable(nccl_communicators)
    rank = None if wanted.least else wanted.bytes(lambda: plain, usable)
    basis = ""
    if device is not None and wanted.kind == USABLE:
        basis = f" ({device.name}'s {device.describe_usable(nccl_communicators)})"
    parts = ", ".join(f"{k} {v:,} B" for k, v in memory.resident_parts.items())
    if rank is not None and rank <= memory.resident:
        raise PlanError(
            f"budget {rank:,} B per rank{basis} is at most the resident bytes "
            f"{memory.resident:,} B ({parts}): nothing is left for the step; shard over more "
            "ranks or give more memory"
        )
    problem = shifted(union, memory)
    try:
        solution = solve_sac(
            problem,
            wanted if rank is None else rank - memory.resident,
            deadline,
            whole,
            shares=shares,
        )
    except InfeasibleBudgetError as e:
        least = None if e.minimum_bytes is None else memory.resident + e.minimum_bytes
        known = "not found in time" if least is None else f"{least:,} B"
        raise InfeasibleBudgetError(
            f"no SAC plan fits {rank:,} B per rank{basis}: the least predicted per-rank peak in "
            f"SAC's space is {known} (resident {memory.resident:,} B: {parts}); give at least "
            "that",
            least,
            memory.resident + e.lower_bound_bytes,
            e.least_plan,
        ) from e
    peak = rank_peak(union, solution.plan, memory)
    bound = memory.resident + solution.budget
    if peak.peak > bound:
        raise InternalError(f"per-rank peak {peak.peak} B above the solved bound {bound} B")
    return ShardedSolution(replace(solution, peak=peak.peak, budget=bound), plain, memory)
