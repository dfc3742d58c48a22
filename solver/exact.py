r"""The exact solver: Checkmate's stage formulation (`solver.formulation`) solved with CP-SAT,
with a proof phase driven by the LP relaxation.

For objective "cost":

1. budget >= checkpoint-all peak: checkpoint-all is optimal (the cost cannot go below computing
   every node once). Budget below the one-line bound (a node plus its inputs): infeasible.
2. Warm start: the cheapest schedule of `solver.families` within the budget, cost z.
3. The model is built for recompute cost <= z - 1 only (`formulation.build`'s recompute_limit:
   nodes costing more are never recomputed, which shrinks it). Its LP relaxation (HiGHS,
   `solver.lp_fixing`) gives a lower bound and reduced costs: when the bound exceeds z - 1, z is
   optimal; otherwise every 0/1 variable whose reduced cost shows it cannot differ in a schedule
   of cost <= z - 1 is fixed. The LP's keep fractions are rounded into schedules
   (`solver.rounding`); one cheaper than z becomes the incumbent and step 3 repeats (at most
   LP_ROUNDS LPs). Without a warm start the model has no limit and rounding may find the first
   schedule.
4. Probes of objective caps between the LP bound and the incumbent (`_probe`): CP-SAT, hinted
   with the incumbent, looks for a schedule of recompute cost <= cap with the variables the LP's
   reduced costs fix at that cap fixed. Infeasible raises the proven lower bound to cap + 1; a
   schedule becomes the incumbent. Infeasible at cap z - 1 proves z optimal. Steps 3 and 4 keep
   every schedule strictly better than the incumbent, so the optimum is unchanged. Without an LP
   (it ran out of time) or an incumbent, CP-SAT solves the model in one run.

Costs must be integers for CP-SAT: non-integer costs are scaled by a power of ten (at most 1e6)
or rounded at a resolution of max(cost)/1e6, recorded as `extra["cost_unit"]`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import networkx as nx

from solver.baselines import Member, cheapest_within, smallest_within
from solver.budget import human_bytes, parse_budget, parse_compute_budget
from solver.cpsat import CpSatModel, ProgressFn, print_progress
from solver.errors import ComputeBudgetError, InfeasibleBudgetError, SolverTimeoutError
from solver.families import all_members, cheapest_member
from solver.formulation import LinearModel, build, hint_values, plan_from_values, variable_count
from solver.graph import Problem, prepare
from solver.lp_fixing import LpRelaxation, reduced_cost_fixings, solve_relaxation
from solver.rounding import rounded_members
from solver.schedule import Schedule, make_schedule
from solver.stages import IndexedSchedule, StagePlan, checkpoint_all, plan_to_ops

LP_SHARE = 0.5
"""Most of the remaining time limit one LP relaxation may take before CP-SAT starts."""

IMPROVE_SHARE = 0.25
"""Share of the remaining time the first probe (anything better than the incumbent) may take."""

PROBE_SHARE = 0.25
"""Share of the remaining time a climbing probe may take (see `_probe`)."""

MAX_MODEL_VARIABLES = 1_500_000
"""Largest stage model built. random_layered n=500 (0.93M variables) builds in about 10 s; at
n=1000 (4.1M) building alone would take minutes and several GiB, so the best heuristic comes
back with the trivial bound instead."""

LP_ROUNDS = 3
"""Most LP relaxations solved: each one whose rounding beats the incumbent is followed by one on
the smaller model below the new incumbent."""


def integer_costs(problem: Problem) -> tuple[list[int], float]:
    """Integer costs for CP-SAT and the unit they are in (cost = int_cost * unit).

    Whole-number costs are used as they are (unit 1, exact). Otherwise costs are scaled by the
    smallest power of ten that makes them whole (to 1e-9), at most 1e6; failing that, rounded at
    a resolution of max(cost) / 1e6.
    """
    costs = problem.cost
    for digits in range(7):
        scale = 10**digits
        if all(abs(c * scale - round(c * scale)) <= 1e-9 * max(1.0, c * scale) for c in costs):
            return [round(c * scale) for c in costs], 1.0 / scale
    unit = max(costs) / 1e6
    return [round(c / unit) for c in costs], unit


def minimum_peak(
    graph: nx.DiGraph,
    *,
    time_limit: float = 60.0,
    workers: int = 8,
    progress: ProgressFn | bool | None = None,
) -> Schedule:
    """The schedule of least peak memory with unlimited recomputation (objective="memory")."""
    return solve(
        graph, objective="memory", time_limit=time_limit, workers=workers, progress=progress
    )


@dataclass
class _Run:
    """Everything one `solve` call shares between its steps."""

    graph: nx.DiGraph
    problem: Problem
    objective: str
    time_limit: float
    workers: int
    report: ProgressFn | None
    int_cost: list[int]
    unit: float
    started: float

    @property
    def offset(self) -> float:
        """Cost of the first computes, in graph units (the objective counts recomputes only)."""
        return sum(self.int_cost) * self.unit

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def solver_progress(self, floor: float = -math.inf) -> ProgressFn | None:
        """`report` for CP-SAT, with seconds counted from the start of `solve` (CP-SAT's own
        clock restarts with every probe) and bounds no lower than `floor` (graph units: what
        is already proven, which a probe's own bound may not know)."""
        report = self.report
        if report is None:
            return None
        return lambda _, objective, bound: report(self.elapsed(), objective, max(bound, floor))

    def remaining(self) -> float:
        return self.time_limit - self.elapsed()

    def finish(
        self,
        ops,
        status: str,
        bound: float | None,
        *,
        budget: int | None = None,
        compute_budget: float | None = None,
    ) -> Schedule:
        return make_schedule(
            self.graph,
            self.problem,
            ops,
            method="exact",
            objective=self.objective,
            status=status,
            bound=bound,
            budget=budget,
            compute_budget=compute_budget,
            solve_seconds=self.elapsed(),
            extra={"cost_unit": self.unit},
        )


def solve(
    graph: nx.DiGraph,
    budget: int | str | None = None,
    *,
    objective: str = "cost",
    compute_budget: float | str | None = None,
    time_limit: float = 60.0,
    workers: int = 8,
    progress: ProgressFn | bool | None = None,
) -> Schedule:
    """Solve for the optimal schedule in the Checkmate stage space.

    Args:
        graph: DAG with `mem` (bytes) and `cost` on every node (see `solver.graph`).
        budget: peak-memory budget for objective="cost": bytes, or text like "512MiB" / "80%"
            (of the checkpoint-all peak). None means unconstrained.
        objective: "cost" (least total cost with peak <= budget) or "memory" (least peak with
            total cost <= compute_budget).
        compute_budget: for objective="memory": cost units, or text like "1.2x" (of the
            checkpoint-all cost). None means unlimited.
        time_limit: seconds for CP-SAT; at the limit the best schedule found so far comes back
            with status "FEASIBLE" and its proven bound.
        workers: CP-SAT search workers (more than the cores still helps: the portfolio differs).
        progress: True to print each improving solution to stderr, or a ProgressFn.

    Raises:
        InfeasibleBudgetError: no schedule fits the budget (names the minimum when it is found).
        ComputeBudgetError: objective="memory" and the compute budget is below the total cost.
        SolverTimeoutError: no schedule within the budget was found within the time limit.
    """
    started = time.perf_counter()
    if objective not in ("cost", "memory"):
        raise ValueError(f"objective must be 'cost' or 'memory', not {objective!r}")
    problem = prepare(graph)
    report = print_progress if progress is True else (progress or None)
    int_cost, unit = integer_costs(problem)
    run = _Run(graph, problem, objective, time_limit, workers, report, int_cost, unit, started)
    if objective == "cost":
        return _solve_cost(run, None if budget is None else parse_budget(budget, problem))
    limit = None if compute_budget is None else parse_compute_budget(compute_budget, problem)
    return _solve_memory(run, limit)


def _solve_cost(run: _Run, budget: int | None) -> Schedule:
    problem = run.problem
    everything = checkpoint_all(problem)
    if budget is None or everything.peak <= budget:
        # No recomputation at all fits: the cost cannot go below computing every node once.
        return run.finish(everything, "OPTIMAL", problem.total_cost, budget=budget)
    if budget < problem.memory_lower_bound:
        _raise_infeasible(run, budget)
    best = cheapest_member(problem, budget)
    limit = None if best is None else _recompute_cost(run, best.schedule) - 1
    size = variable_count(problem, run.int_cost, limit)
    if size > MAX_MODEL_VARIABLES:
        if best is None:
            raise SolverTimeoutError(
                f"no heuristic fits {human_bytes(budget)} and the exact model of this graph "
                f"would have {size} variables (the limit is {MAX_MODEL_VARIABLES}); raise the "
                "budget, or capture the model coarser (graph_capture granularity='module')"
            )
        # Without the model the only proven bound is that of computing every node once.
        return run.finish(best.schedule, "FEASIBLE", problem.total_cost, budget=budget)
    lm, lp = None, None
    for _ in range(LP_ROUNDS):
        limit = None if best is None else _recompute_cost(run, best.schedule) - 1
        lm = build(problem, budget, run.int_cost, limit)
        lp = solve_relaxation(lm, LP_SHARE * run.remaining())
        if lp is None:
            break
        if run.report:  # the LP phase is silent otherwise: show its bound
            shown = math.inf if best is None else best.schedule.cost
            run.report(run.elapsed(), shown, lp.objective * run.unit + run.offset)
        fractions = [{i: lp.values[v] for i, v in stage.items()} for stage in lm.keep]
        rounded = cheapest_within(rounded_members(problem, fractions), budget)
        if rounded is None or (best is not None and rounded.schedule.cost >= best.schedule.cost):
            break
        best = rounded
    if best is None or lp is None:
        return _search(run, lm, best, budget)
    return _probe(run, lm, lp, best.plan, budget)


def _search(run: _Run, lm: LinearModel, best: Member | None, budget: int) -> Schedule:
    """One CP-SAT run over the whole model (no LP to fix variables with)."""
    problem = run.problem
    result = CpSatModel(lm).solve(
        time_limit=run.remaining(),
        workers=run.workers,
        hint=None if best is None else hint_values(lm, problem, best.plan),
        progress=run.solver_progress(),
        scale=run.unit,
        offset=run.offset,
    )
    if result.status == "INFEASIBLE":
        if best is None:
            _raise_infeasible(run, budget)
        return run.finish(best.schedule, "OPTIMAL", best.schedule.cost, budget=budget)
    if result.values is not None:
        found = plan_to_ops(problem, plan_from_values(lm, problem.n, result.values.__getitem__))
        status = "OPTIMAL" if result.status == "OPTIMAL" else "FEASIBLE"
        return run.finish(found, status, result.bound * run.unit + run.offset, budget=budget)
    if best is None:
        raise SolverTimeoutError(
            f"no schedule within {human_bytes(budget)} was found in {run.time_limit:g} s and no "
            "heuristic fits that budget; raise the time limit (--time-limit) or the budget"
        )
    # The model holds every schedule cheaper than the incumbent, so CP-SAT's bound holds for
    # them; the incumbent itself bounds the rest.
    bound = min(result.bound, _recompute_cost(run, best.schedule))
    return run.finish(best.schedule, "FEASIBLE", bound * run.unit + run.offset, budget=budget)


def _probe(run: _Run, lm: LinearModel, lp: LpRelaxation, plan: StagePlan, budget: int) -> Schedule:
    """Close the gap between the LP bound and the incumbent by probing objective caps.

    Each probe asks CP-SAT for a schedule of recompute cost <= cap on the model with every
    variable fixed that the LP's reduced costs fix at that cap (the lower the cap, the more are
    fixed and the smaller the search). Infeasible raises the lower bound to cap + 1; a schedule
    is a new incumbent (optimal when CP-SAT proves it optimal under the cap). Probes first ask
    for anything better than the incumbent (cap z - 1) for a short while, which proves a good
    incumbent optimal at once. When that runs out of time, caps climb from the lower bound a
    quarter of the gap at a time: low caps fix most variables, so they are refuted or solved
    fast (ResNet50 at 90%: cap z - 1 found nothing in 60 s, a cap a quarter of the way up
    solved it to optimality in 15 s). When a climbing probe finds a schedule or runs out of its
    share of the time, the final cap gets all the time left. `lm` holds every schedule cheaper
    than the first incumbent, so all of this is exact.
    """
    problem = run.problem
    schedule = plan_to_ops(problem, plan)
    incumbent = _recompute_cost(run, schedule)
    lower = min(incumbent, math.ceil(lp.objective - 1e-6 * max(1.0, abs(lp.objective))))
    phase = "improve"  # -> "climb" -> "last"
    model = CpSatModel(lm)
    hint = hint_values(lm, problem, plan)
    while lower < incumbent and run.remaining() > 0.01:
        cap = incumbent - 1
        if phase == "climb":
            cap = lower + (incumbent - 1 - lower) // 4
        share = {"improve": IMPROVE_SHARE, "climb": PROBE_SHARE, "last": 1.0}[phase]
        if phase == "climb" and cap == incumbent - 1:
            share = 1.0
        result = model.solve(
            time_limit=run.remaining() * share,
            workers=run.workers,
            hint=hint,
            fixed=reduced_cost_fixings(lm, lp, cap),
            objective_cap=cap,
            progress=run.solver_progress(lower * run.unit + run.offset),
            scale=run.unit,
            offset=run.offset,
        )
        if result.status == "INFEASIBLE":
            lower = cap + 1
        elif result.values is not None:
            plan = plan_from_values(lm, problem.n, result.values.__getitem__)
            schedule, hint = plan_to_ops(problem, plan), hint_values(lm, problem, plan)
            incumbent = _recompute_cost(run, schedule)
            proven = incumbent if result.status == "OPTIMAL" else math.ceil(result.bound - 1e-6)
            lower = max(lower, proven)
            if phase == "climb":  # a low cap found a schedule: likely near optimal, prove it
                phase = "last"
        else:  # out of time under this cap: what it proved holds for schedules within the cap
            lower = max(lower, min(math.ceil(result.bound - 1e-6), cap + 1))
            if share == 1.0:
                break
            phase = "climb" if phase == "improve" else "last"
        if run.report:
            run.report(run.elapsed(), schedule.cost, lower * run.unit + run.offset)
    if lower >= incumbent:
        return run.finish(schedule, "OPTIMAL", schedule.cost, budget=budget)
    return run.finish(schedule, "FEASIBLE", lower * run.unit + run.offset, budget=budget)


def _recompute_cost(run: _Run, schedule: IndexedSchedule) -> int:
    """Recompute cost of a schedule in the model's integer units."""
    total = sum(run.int_cost[i] for kind, i in schedule.ops if kind == "compute")
    return total - sum(run.int_cost)


def _solve_memory(run: _Run, compute_budget: float | None) -> Schedule:
    problem = run.problem
    if compute_budget is not None and compute_budget < problem.total_cost * (1 - 1e-12):
        raise ComputeBudgetError(
            f"compute budget {compute_budget:g} is below {problem.total_cost:g}, the cost of "
            "computing every node once; no schedule can fit (use a budget >= 1.0x)"
        )
    warm = smallest_within(all_members(problem), compute_budget)
    # checkpoint-all always fits a compute budget >= the total cost
    assert warm is not None, "no baseline fits a compute budget above the total cost"
    lower = float(problem.memory_lower_bound)
    if warm.schedule.peak <= lower:  # a node with its inputs needs this much in any schedule
        return run.finish(warm.schedule, "OPTIMAL", lower, compute_budget=compute_budget)
    recompute_limit = None
    if compute_budget is not None:
        recompute_limit = int(compute_budget / run.unit + 1e-9) - sum(run.int_cost)
    if variable_count(problem, run.int_cost, recompute_limit) > MAX_MODEL_VARIABLES:
        return run.finish(warm.schedule, "FEASIBLE", lower, compute_budget=compute_budget)
    lm = build(problem, None, run.int_cost, recompute_limit)
    result = CpSatModel(lm).solve(
        time_limit=run.remaining(),
        workers=run.workers,
        hint=hint_values(lm, problem, warm.plan),
        progress=run.solver_progress(),
    )
    bound = max(result.bound, lower)
    if result.values is not None:
        found = plan_to_ops(problem, plan_from_values(lm, problem.n, result.values.__getitem__))
        if found.peak <= warm.schedule.peak or result.status == "OPTIMAL":
            status = "OPTIMAL" if result.status == "OPTIMAL" else "FEASIBLE"
            return run.finish(found, status, bound, compute_budget=compute_budget)
    return run.finish(warm.schedule, "FEASIBLE", bound, compute_budget=compute_budget)


def _raise_infeasible(run: _Run, budget: int) -> None:
    """Find the least feasible peak (within the remaining time) and raise with it named."""
    problem = run.problem
    lower = problem.memory_lower_bound
    memory_run = _Run(
        run.graph,
        problem,
        "memory",
        max(1.0, run.remaining()),
        run.workers,
        None,
        run.int_cost,
        run.unit,
        time.perf_counter(),
    )
    least = _solve_memory(memory_run, None)
    if least.status == "OPTIMAL":
        minimum, what = least.peak, f"the minimum feasible budget is {least.peak} bytes"
    else:
        minimum = None
        what = (
            f"the minimum feasible budget is between {int(least.bound or lower)} and "
            f"{least.peak} bytes (not proven within the time limit)"
        )
    raise InfeasibleBudgetError(
        f"no schedule fits a budget of {budget} bytes ({human_bytes(budget)}): {what} "
        f"({human_bytes(least.peak)}); raise the budget to at least that",
        minimum_bytes=minimum,
        lower_bound_bytes=max(lower, int(least.bound or lower)),
    )
