"""The least-recompute SAC plan under a peak budget (`solve_sac`) and the least peak
(`least_peak`): the 0/1 model of `solver.sac.plan_model` solved by CP-SAT.

Every returned plan is evaluated by the reference (`solver.sac.union.union_peak`, which runs
`solver.sac.memory`), whose peak and cost are the ones reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.core.budget import Budget, as_percent, plain_step
from solver.core.link import Link
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, InternalError, SolverTimeoutError
from solver.sac.memory import SacPlan
from solver.sac.plan_model import NS, PlanModel
from solver.sac.problem import SacProblem
from solver.sac.union import SacUnion, UnionPlan, union_cost, union_host, union_peak
from solver.time_shares import SAC_SHARES, SacShares


@dataclass(frozen=True)
class SacSolution:
    """A solved plan: `peak` (predicted bytes) and `cost` (recompute seconds plus each region's
    checkpoint price plus the SAC runtime's overhead of the regions that save an op) from the
    reference
    model, `status` ("OPTIMAL" or "FEASIBLE"), `bound` (proven lower bound on the cost, seconds),
    `gap` ((cost - bound) / cost, 0 when cost is 0) and `budget` (bytes); with a link, the cost
    includes the copies' predicted stall and `host_peak` is the bytes the host copies hold at
    their most, as the link's host allocator rounds each buffer (0 without offload)."""

    plan: SacPlan | UnionPlan
    peak: int
    cost: float
    status: str
    bound: float
    gap: float
    budget: int
    host_peak: int = 0


def least_peak(
    union: SacUnion, deadline: Deadline, whole: bool = True, link: Link | None = None
) -> tuple[UnionPlan, int, bool]:
    """The plan of least predicted peak (bytes), whether that is proven, ties broken by nothing;
    with `link`, over the plans that may offload too."""
    model = PlanModel(union, union.plain_peak + _upper_slack(union), whole, link)
    model.m.Minimize(model.peak)
    solver, status = model.solve(deadline)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError("no SAC plan found within the time limit: give more time")
    plan = model.plan(solver)
    return plan, union_peak(union, plan), status == cp_model.OPTIMAL


def _upper_slack(union: SacUnion) -> int:
    """Bytes by which a plan's peak may exceed the plain step's (a checkpoint holding inputs the
    plain block frees): bounds P's domain for the least-peak search."""
    regions = list(union.blocks.blocks)
    regions += [c for split in union.splits if split is not None for c in split.children]
    return sum(max(b.held_extra, 0) + b.workspace for b in regions) + sum(
        op.new_bytes for b in regions for op in b.ops
    )


def solve_sac(
    problem: SacProblem | SacUnion,
    budget: Budget | int | str,
    deadline: Deadline,
    whole: bool = True,
    link: Link | None = None,
    shares: SacShares = SAC_SHARES,
) -> SacSolution:
    """The plan of least cost (recompute seconds plus each region's checkpoint price plus the SAC
    runtime's overhead of each region saving an op) whose predicted peak is at most `budget`
    (`Budget`: bytes, a percentage of the plain step, or "min": the least peak any plan reaches,
    found with `shares.least_peak` of the time left). Over a `SacUnion` the plan is a `UnionPlan`
    (per block: none, whole, or children; `whole=False`: never whole where a split exists),
    over a `SacProblem` a `SacPlan`. With `link` (a host link), each saved op may also be
    offloaded to the host and reloaded for the recompute (NOTE [ SAC offload model ],
    solver/sac/memory.py), the copies' predicted stall in the cost and their bytes within the
    link's `host_memory`; without one the plans offload nothing. InfeasibleBudgetError names
    that least peak when the budget is below it; SolverTimeoutError when no plan is found in
    time."""
    union = problem if isinstance(problem, SacUnion) else SacUnion.whole(problem)
    wanted = Budget.of(budget)
    if wanted.least:
        _, budget, _ = least_peak(union, deadline.share(shares.least_peak), whole, link)
    else:
        budget = wanted.bytes(lambda: union.plain_peak)
    model = PlanModel(union, int(budget), whole, link)
    model.m.Minimize(model.cost())
    solver, status = model.solve(deadline)
    if status == cp_model.INFEASIBLE:
        hundred = plain_step(union.plain_peak_basis)
        try:
            plan, least, proven = least_peak(union, deadline, whole, link)
        except SolverTimeoutError as e:
            raise InfeasibleBudgetError(
                f"no SAC plan fits {budget} bytes, and the least predicted peak was not found "
                "in the time left: raise the budget or time_limit, or ask for 'min'",
                None,
                int(budget) + 1,
            ) from e
        raise InfeasibleBudgetError(
            f"no SAC plan fits {budget} bytes: the least predicted peak in SAC's space is "
            f"{least} bytes ({as_percent(least, union.plain_peak, hundred)})"
            f"{'' if proven else ' (found, not proven least)'}; give at least that",
            least if proven else None,
            int(budget) + 1,
            plan if isinstance(problem, SacUnion) else plan.blocks,
        )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError(f"no SAC plan within {budget} bytes found in time: give more time")
    plan = model.plan(solver)
    peak, cost = union_peak(union, plan), union_cost(union, plan, link)
    if peak > budget:
        raise InternalError(f"CP-SAT's plan peaks at {peak} > {budget} bytes in the reference")
    bound = min(solver.BestObjectiveBound() / NS, cost)
    optimal = status == cp_model.OPTIMAL
    gap = 0.0 if optimal or cost <= 0 else (cost - bound) / cost
    result = plan if isinstance(problem, SacUnion) else plan.blocks
    status_ = "OPTIMAL" if optimal else "FEASIBLE"
    host = union_host(union, plan, link)
    return SacSolution(result, peak, cost, status_, bound, gap, budget, host)
