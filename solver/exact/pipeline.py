r"""The exact solver: Checkmate's stage formulation (`solver.formulation`), its LP relaxation
for bounds and variable fixing, and probes of objective caps solved by HiGHS's branch and cut or
CP-SAT.

For objective "cost":

1. budget >= checkpoint-all peak: checkpoint-all is optimal (the cost cannot go below computing
   every node once). Budget below the one-line bound (a node plus its inputs): infeasible.
2. Warm start: the eviction heuristic at the budget (`solver.eviction`), cost z; the cheapest
   schedule of `solver.families` within the budget replaces it when cheaper (evaluated while
   HiGHS solves the first LP on another core, or first when eviction fits nothing).
3. The read-gap cover (`solver.cover_bound`, CP-SAT on a small covering model): its bound is the
   proven floor of every later step and its plan a further warm start; an incumbent that costs
   the floor is optimal with no stage model (MobileNet and ResNet50 at 90% and 80%: 0.1-0.4 s).
4. The model is built for recompute cost <= z only (`formulation.build`'s recompute_limit:
   nodes costing more are never recomputed, which shrinks it; the incumbent stays in it as a
   complete hint for CP-SAT). Its LP relaxation (HiGHS, `solver.lp_fixing`) gives a lower bound
   and reduced costs: when the bound exceeds z - 1, z is optimal; otherwise every 0/1 variable whose
   reduced cost shows it cannot differ in a schedule of cost <= a cap is fixed for the probes below.
   The LP's keep fractions are rounded into schedules (`solver.rounding`, and an eviction run
   that evicts what the LP keeps least, `solver.eviction.evict_by_keep`); one cheaper than z
   becomes the incumbent. Without a warm start the model has no limit and rounding may find the
   first schedule.
5. Probes (`_probe`). On large models whose LP bound is within MIP_GAP of z, HiGHS's branch and
   cut is asked for schedules of recompute cost <= cap, caps climbing from the lower bound (two
   at once, on two threads), with the variables the LP fixes at that cap fixed: infeasible
   raises the proven lower bound to cap + 1, a schedule becomes the incumbent (optimal when
   proven optimal under its cap).
   Whatever remains open goes to one CP-SAT run that minimises under cap z from the incumbent.
   Steps 4 and 5 keep every schedule at least as good as the incumbent, so the optimum is
   unchanged. Without an LP (it ran out of time) or an incumbent, CP-SAT solves the model in one
   run.

Costs must be integers for CP-SAT: non-integer costs are scaled by a power of ten (at most 1e6)
or rounded at a resolution of max(cost)/1e6, recorded as `extra["cost_unit"]`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import networkx as nx

from solver.core.budget import human_bytes, parse_budget, parse_compute_budget
from solver.core.graph import Problem, prepare
from solver.core.schedule import Schedule, make_schedule
from solver.core.simulate import simulate
from solver.core.stages import (
    IndexedSchedule,
    StagePlan,
    checkpoint_all,
    complete_prefix,
    plan_to_ops,
)
from solver.errors import ComputeBudgetError, InfeasibleBudgetError, SolverTimeoutError
from solver.heuristics.backward import backward_within
from solver.heuristics.baselines import Member, cheapest_within, smallest_within
from solver.heuristics.eviction import evict_by_keep, evict_within
from solver.heuristics.least_peak import least_peak
from solver.heuristics.registry import all_members, cheapest_policy
from solver.heuristics.rounding import rounded_members
from solver.milp.cover import read_gap_cover
from solver.milp.cpsat import CpSatModel, ProgressFn, print_progress
from solver.milp.formulation import (
    LinearModel,
    build,
    hint_values,
    plan_from_values,
    variable_count,
)
from solver.milp.highs_mip import HighsMip
from solver.milp.lp import LpRelaxation, reduced_cost_fixings, solve_relaxation

LP_SHARE = 0.5
"""Most of the remaining time limit one LP relaxation may take before CP-SAT starts."""

PROBE_SHARE = 0.5
"""Share of the remaining time a climbing HiGHS probe may take (see `_climb`)."""

LP_REPEAT_SHARE = 0.1
"""After a rounding beats the incumbent, the model is rebuilt at its cost and its LP solved again
(another LP optimum, another rounding) while an LP takes less than this share of the remaining
time: MobileNet at 90% (2 s LPs) reached the optimum 265 from 340 in three rounds in one
measurement and stopped at 325 in another (each LP optimum is one of several); ResNet50's 12-15 s
LPs are not repeated, its HiGHS probes find the optimum faster."""

COVER_SHARE = 0.1
"""Share of the time limit the read-gap cover (`solver.cover_bound`) may take: it is solved in
0.02-0.5 s on the published graphs and 3-4 s on random_layered n=1000."""

COVER_WORKERS = 1
"""CP-SAT workers for the read-gap cover: one is deterministic (the same solution, so the same
plan, on every run) and as fast or faster than 8 (three runs each: ResNet50 at 90% 0.08 s
against 0.23-0.42 s, at 80% 0.44-0.49 s against 0.50-0.54 s; random_layered n=1000 3.3-4.0 s
against 3.4-3.6 s)."""

HEURISTIC_SHARE = 0.1
"""Share of the time limit the least-peak search (objective "memory") may take: each of its
eviction runs costs up to 1-8 s on random_layered n=1000, each backward search that finds
nothing 1-4 s."""

WARM_START_SHARE = 0.5
"""Share of the time limit the backward searches at the budget (objective "cost") may take:
they stop at their state limits first (1-4 s where they find nothing; random_layered n=250 at
80%, where eviction gets stuck and they are the only warm start, 1.5 s for both), so this binds
only at short limits (at 10 s a tenth had cut the cheaper search off)."""

MAX_MODEL_VARIABLES = 1_500_000
"""Largest stage model built. random_layered n=500 (0.93M variables) builds in about 10 s; at
n=1000 (4.1M) building alone would take minutes and several GiB, so the best heuristic comes
back with the trivial bound instead."""

CLIMB_FIRST_STEP = 1 / 8
"""`_climb`'s first cap is this share of the gap above the lower bound."""

CLIMB_GROWTH = 1.5
"""`_climb`'s step grows by this factor after each refuted cap."""

CLIMB_PAIRS = True
"""`_climb` probes two caps at once, on two threads: the next cap and the one that would follow
its refutation."""

MIP_GAP = 0.5
"""Probes use HiGHS's branch and cut (`solver.mip`) when the LP bound is within this share of the
incumbent's recompute cost and the model has at least MIP_MIN_VARIABLES variables, else CP-SAT
(see `_probe`). The op-level demo graphs (LP bound 1-10% of the incumbent) and FCN8 (39%) are
searched better by CP-SAT."""

MOMENT_LATE_SHARE = 0.5
"""The moment relaxation (`_relax`) runs first when the first stage over the budget in
checkpoint-all comes after this share of the stages and the relaxation has at most
MOMENT_MAX_VARIABLES variables. random_layered n=250 at 90% (first tight stage 213 of 250, 17k
variables against 190k in the stage model) is proven in it in 20-40 s, where the stage model ends
at the 60 s limit with a 0.5% gap; ResNet50 (stage 94 of 353) took 58 s in it against 14-27 s
through the stage model's LP and probes, MobileNet (46 of 185) 24 s against 4-7 s. Where the
first overflow is earlier it runs after the LP, when the LP is weak (`_probe`)."""

MOMENT_MAX_VARIABLES = 160_000
"""See MOMENT_LATE_SHARE. random_layered n=500 at 90% (first tight stage 307 of 500, 156k
variables): in the relaxation its bound rises with time (600 s, two solves: 642 and 684 cost
units of recompute, above the read-gap cover's 514; one standalone 300 s run also found a fitting
plan of 1881 against the warm start's 2045, the solves' plans overflowed or cost more), where
its stage model (0.93M variables) gave nothing in 600 s: its LP does not finish."""

MIP_MIN_VARIABLES = 20_000
"""Below this, CP-SAT alone is as fast or faster: VGG19 at 80% (4.7k variables) proved in
1.3 s with CP-SAT, 2-3.7 s with HiGHS's presolve and cuts."""


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
    floor: int = 0
    """Proven lower bound on the recompute cost (model units) from an earlier phase (`_relax`)."""

    @property
    def offset(self) -> float:
        """Cost of the first computes, in graph units (the objective counts recomputes only)."""
        return sum(self.int_cost) * self.unit

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def solver_progress(
        self, floor: float = -math.inf, incumbent: float | None = None
    ) -> ProgressFn | None:
        """`report` for CP-SAT, with seconds counted from the start of `solve` (CP-SAT's own
        clock restarts with every probe) and bounds no lower than `floor` (graph units: what
        is already proven, which a probe's own bound may not know). With `incumbent` (graph
        units) that is reported instead of CP-SAT's objective: a relaxation's solutions are not
        schedules."""
        report = self.report
        if report is None:
            return None

        def forward(_: float, objective: float, bound: float) -> None:
            shown = objective if incumbent is None else incumbent
            report(self.elapsed(), shown, max(bound, floor))

        return forward

    def remaining(self) -> float:
        return self.time_limit - self.elapsed()

    @property
    def deadline(self) -> float:
        """The time limit as a `time.perf_counter()` instant."""
        return self.started + self.time_limit

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
    # Each stage of checkpoint-all computes only its own node: the first stage over the budget.
    first = min(t for t, peak in enumerate(everything.stage_peaks) if peak > budget)
    relaxed = first >= MOMENT_LATE_SHARE * problem.n
    best, later = _warm_starts(run, budget, backward_first=relaxed)
    cover = read_gap_cover(
        problem,
        budget,
        run.int_cost,
        time_limit=COVER_SHARE * run.time_limit,
        workers=COVER_WORKERS,
    )
    run.floor = cover.bound
    best = _cheaper(best, cover.member, budget)
    if best is not None and run.floor >= _recompute_cost(run, best.schedule):
        return run.finish(best.schedule, "OPTIMAL", best.schedule.cost, budget=budget)
    limit = None if best is None else _recompute_cost(run, best.schedule)
    if relaxed:
        # The later warm starts (Python) are evaluated while CP-SAT solves the relaxation.
        best, other = _beside(partial(_relax, run, first, limit, best, budget), later)
        best, later = _cheaper(best, other, budget), _no_member
        if best is not None and run.floor >= _recompute_cost(run, best.schedule):
            return run.finish(best.schedule, "OPTIMAL", best.schedule.cost, budget=budget)
        limit = None if best is None else _recompute_cost(run, best.schedule)
    size = variable_count(problem, run.int_cost, limit)
    if size > MAX_MODEL_VARIABLES:
        return _without_model(
            run,
            _cheaper(best, later(), budget),
            budget,
            f"the exact model of this graph would have {size} variables (the limit is "
            f"{MAX_MODEL_VARIABLES}); raise the budget, or capture the model coarser "
            "(graph_capture granularity='module')",
        )
    while True:
        try:
            lm = build(problem, budget, run.int_cost, limit, deadline=run.deadline)
        except TimeoutError:
            return _without_model(
                run,
                _cheaper(best, later(), budget),
                budget,
                f"the exact model was not built within {run.time_limit:g} s; raise the time "
                "limit (--time-limit) or the budget",
            )
        started = run.elapsed()
        # The later warm starts (Python) are evaluated while HiGHS solves the LP on another core.
        lp, other = _beside(partial(solve_relaxation, lm, LP_SHARE * run.remaining()), later)
        best, later = _cheaper(best, other, budget), _no_member
        if lp is None:
            break
        if run.report:  # the LP phase is silent otherwise: show its bound
            shown = math.inf if best is None else best.schedule.cost
            run.report(run.elapsed(), shown, lp.objective * run.unit + run.offset)
        fractions = [{i: lp.values[v] for i, v in stage.items()} for stage in lm.keep]
        guided = evict_by_keep(problem, budget, fractions)
        rounded = cheapest_within(
            [*rounded_members(problem, fractions), *filter(None, [guided])], budget
        )
        if rounded is None or (best is not None and rounded.schedule.cost >= best.schedule.cost):
            break
        best = rounded
        limit = _recompute_cost(run, best.schedule)
        if run.elapsed() - started > LP_REPEAT_SHARE * run.remaining():
            break
        if variable_count(problem, run.int_cost, limit) == len(lm.names):
            break  # the same model less a slack limit row: the same LP optimum and rounding
    if best is None or lp is None:
        return _search(run, lm, best, budget)
    return _probe(run, lm, lp, best, budget, None if relaxed else first)


def _warm_starts(
    run: _Run, budget: int, backward_first: bool
) -> tuple[Member | None, Callable[[], Member | None]]:
    """The incumbent to build the first model at, and the warm starts still to evaluate (beside
    the first LP or the relaxation, on the other core). Eviction runs first (milliseconds; on
    the published graphs within 0.1% of the optimum); the backward searches (0.07 s on FCN8,
    where the one by cost finds nothing, 1-3 s on the op-level demo graphs) and the checkpoint
    policies (1-6 s) wait, unless nothing before them fits (random_layered n=250 at 80%:
    eviction gets stuck, the backward searches fit) or `backward_first` (the relaxation runs
    first and takes the incumbent's cost as its cap: random_layered n=500 at 90%, eviction
    17553, backward search 2045)."""
    problem = run.problem
    deadline = run.started + WARM_START_SHARE * run.time_limit
    backward = partial(backward_within, problem, budget, deadline)
    policies = partial(cheapest_policy, problem, budget, fallback=False)
    evicted = evict_within(problem, budget)
    if evicted is not None and not backward_first:
        return evicted, lambda: _cheaper(backward(), policies(), budget)
    found = _cheaper(evicted, backward(), budget)
    if found is not None:
        return found, policies
    return cheapest_policy(problem, budget), _no_member


def _relax(
    run: _Run, first: int, limit: int | None, best: Member | None, budget: int
) -> Member | None:
    """CP-SAT on the moment relaxation from stage `first` (`formulation.build` with
    moment_stages), from the incumbent as a complete hint and under its cost `limit` as a cap,
    for the rest of the time; raises `run.floor` to the lower bound it proves and returns the
    better of the incumbent and the relaxation's plan (its stages before `first` completed
    without recomputation), which counts only when it fits the budget. When a plan proven
    optimal for the relaxation does not fit, the stages where it exceeds the budget get their
    exact memory rows (and the model starts at the earliest of them) and the relaxation is
    solved again: each round is still a relaxation, so every bound holds, and each adds a stage
    whose memory is exact, so the rounds end; while the model has at most MOMENT_MAX_VARIABLES
    variables. Infeasible under the cap proves the incumbent optimal, and without one that no
    schedule fits."""
    problem = run.problem
    exact_stages: set[int] = set()
    while run.remaining() > 0.01:
        moments = frozenset(range(first, problem.n)) - exact_stages
        shape = {"first_stage": first, "moment_stages": moments}
        if variable_count(problem, run.int_cost, limit, **shape) > MOMENT_MAX_VARIABLES:
            break
        lm = build(problem, budget, run.int_cost, limit, **shape)
        result = CpSatModel(lm).solve(
            time_limit=run.remaining(),
            workers=run.workers,
            hint=None if best is None else hint_values(lm, problem, best.plan),
            objective_cap=limit,
            progress=run.solver_progress(
                run.floor * run.unit + run.offset,
                math.inf if best is None else best.schedule.cost,
            ),
            scale=run.unit,
            offset=run.offset,
        )
        if result.status == "INFEASIBLE":
            if best is None:
                _raise_infeasible(run, budget)
            run.floor = max(run.floor, _recompute_cost(run, best.schedule))
            break
        proven = result.objective if result.status == "OPTIMAL" else math.ceil(result.bound - 1e-6)
        run.floor = max(run.floor, min(proven, limit if limit is not None else proven))
        if result.values is None:
            break
        plan = plan_from_values(lm, problem.n, result.values.__getitem__)
        plan = complete_prefix(problem, plan, first)
        found = Member("moment relaxation", plan, plan_to_ops(problem, plan))
        best = _cheaper(best, found, budget)
        over = {t for t, peak in enumerate(found.schedule.stage_peaks) if peak > budget}
        if not over or result.status != "OPTIMAL":
            break
        exact_stages |= over
        first = min(first, *over)  # a stage of the completed prefix: the model starts there
    return best


T = TypeVar("T")
R = TypeVar("R")


def _no_member() -> Member | None:
    return None


def _cheaper(a: Member | None, b: Member | None, budget: int) -> Member | None:
    """The cheaper of two warm starts within the budget (either may be None)."""
    return cheapest_within(filter(None, [a, b]), budget)


def _beside(task: Callable[[], R], work: Callable[[], T]) -> tuple[R, T]:
    """`task` (a solve that spends its time in HiGHS or CP-SAT, outside Python's lock) on a
    second thread while `work` runs on this one; both results. ResNet50's policies take 1-1.6 s,
    its LP 12-20 s; random_layered n=250's policies 6 s."""
    result: list[R] = []
    failure: list[BaseException] = []

    def run_task() -> None:
        try:
            result.append(task())
        except BaseException as exc:  # re-raised below, in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run_task)
    thread.start()
    try:
        value = work()
    finally:
        thread.join()
    if failure:
        raise failure[0]
    return result[0], value


def _without_model(run: _Run, best: Member | None, budget: int, why: str) -> Schedule:
    """The best schedule so far, as "FEASIBLE" with the only bound known without the model (every
    node computed once, or what `_relax` proved); SolverTimeoutError saying `why` when there is
    none."""
    if best is None:
        proven = f" (any schedule recomputes at least {run.floor * run.unit:g} cost units)"
        raise SolverTimeoutError(
            f"no heuristic fits {human_bytes(budget)}{proven if run.floor else ''} and {why}"
        )
    bound = run.problem.total_cost + run.floor * run.unit
    return run.finish(best.schedule, "FEASIBLE", bound, budget=budget)


def _search(run: _Run, lm: LinearModel, best: Member | None, budget: int) -> Schedule:
    """One CP-SAT run over the whole model (no LP to fix variables with)."""
    problem = run.problem
    hint = None if best is None else hint_values(lm, problem, best.plan)
    result = CpSatModel(lm).solve(
        time_limit=run.remaining(),
        workers=run.workers,
        hint=hint,
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
        bound = max(result.bound, run.floor)
        return run.finish(found, status, bound * run.unit + run.offset, budget=budget)
    if best is None:
        raise SolverTimeoutError(
            f"no schedule within {human_bytes(budget)} was found in {run.time_limit:g} s and no "
            "heuristic fits that budget; raise the time limit (--time-limit) or the budget"
        )
    # The model holds every schedule cheaper than the incumbent, so CP-SAT's bound holds for
    # them; the incumbent itself bounds the rest.
    bound = min(max(result.bound, run.floor), _recompute_cost(run, best.schedule))
    return run.finish(best.schedule, "FEASIBLE", bound * run.unit + run.offset, budget=budget)


def _probe(
    run: _Run,
    lm: LinearModel,
    lp: LpRelaxation,
    best: Member,
    budget: int,
    first: int | None,
) -> Schedule:
    """Close the gap between the LP bound and the incumbent.

    Where the LP bound is within MIP_GAP of the incumbent on a large model, HiGHS's branch and
    cut probes climbing caps first (`_climb`). Elsewhere the LP is weak and the moment relaxation
    from stage `first` (None: it has run already) goes first (`_relax`, under the incumbent's cost
    as a cap): its bound is what CP-SAT can prove there, and where its plan fits that is the
    optimum. CP-SAT on the stage model, started from the incumbent, gets whatever remains open
    (`_minimise`). `lm` holds the first incumbent and every better schedule, and each probe
    keeps every schedule within its cap, so all of this is exact.
    """
    plan, schedule = best.plan, best.schedule
    incumbent = _recompute_cost(run, schedule)
    lp_bound = math.ceil(lp.objective - 1e-6 * max(1.0, abs(lp.objective)))
    lower = min(incumbent, max(lp_bound, run.floor))
    close = incumbent - lower <= MIP_GAP * incumbent
    if lower < incumbent and close and len(lm.names) >= MIP_MIN_VARIABLES:
        plan, schedule, lower = _climb(run, lm, lp, plan, schedule, budget, lower)
    elif lower < incumbent and first is not None:
        relaxed = _relax(run, first, incumbent, best, budget)
        assert relaxed is not None  # best fits, so the cheaper of it and the relaxation's does
        plan, schedule = relaxed.plan, relaxed.schedule
        lower = max(lower, min(run.floor, _recompute_cost(run, schedule)))
    if lower < _recompute_cost(run, schedule) and run.remaining() > 0.01:
        plan, schedule, lower = _minimise(run, lm, lp, plan, schedule, lower)
    if lower >= _recompute_cost(run, schedule):
        return run.finish(schedule, "OPTIMAL", schedule.cost, budget=budget)
    return run.finish(schedule, "FEASIBLE", lower * run.unit + run.offset, budget=budget)


def _climb(
    run: _Run,
    lm: LinearModel,
    lp: LpRelaxation,
    plan: StagePlan,
    schedule: IndexedSchedule,
    budget: int,
    lower: int,
) -> tuple[StagePlan, IndexedSchedule, int]:
    """HiGHS probes of objective caps climbing from the lower bound, starting from the incumbent
    `plan` (expanded into `schedule`); the best plan, its schedule and the proven lower bound
    (recompute cost, model units) come back.

    Each probe asks for a schedule of recompute cost <= cap with every variable fixed that the
    LP's reduced costs fix at that cap (the lower the cap, the more are fixed). Infeasible
    raises the lower bound to cap + 1 and grows the step by CLIMB_GROWTH (CLIMB_FIRST_STEP of
    the gap first); a schedule becomes the incumbent, optimal when HiGHS proves it optimal under
    the cap. A low cap is refuted in seconds and the first cap at or above the optimum finds it
    with its proof (ResNet50 at 80%: cap 1149 of gap 1097..1450 solved to the optimum 1130 in
    14 s; cap 1449 found nothing in 24 s). With CLIMB_PAIRS two caps are probed at once, the
    next one and the one its refutation would lead to; every outcome is a statement about the
    schedules within its cap, so both are applied. Stops when a probe runs out of its share of
    the time or a schedule fails the exact check (HiGHS works in floating point): CP-SAT takes
    over from there.
    """
    problem = run.problem
    mip = HighsMip(lm, lp.scaled)
    incumbent = _recompute_cost(run, schedule)
    step = max(1, round((incumbent - 1 - lower) * CLIMB_FIRST_STEP))
    while lower < incumbent and run.remaining() > 0.01:
        caps = [min(incumbent - 1, lower + step)]
        step = _grown(step)
        if CLIMB_PAIRS and caps[0] < incumbent - 1:  # the cap that follows when caps[0] fails
            caps.append(min(incumbent - 1, caps[0] + 1 + step))
            step = _grown(step)
        share = 1.0 if caps[-1] == incumbent - 1 else PROBE_SHARE
        probes = [(reduced_cost_fixings(lm, lp, cap), cap) for cap in caps]
        results = mip.solve_all(probes, time_limit=run.remaining() * share)
        go_on = True
        for cap, result in zip(caps, results, strict=True):
            if result.status == "INFEASIBLE":
                lower = max(lower, cap + 1)
                continue
            if result.values is not None:
                found = plan_from_values(lm, problem.n, result.values.__getitem__)
                expanded = plan_to_ops(problem, found)
                if not _fits(run, expanded, budget, cap):
                    go_on = False
                    continue
                cost = _recompute_cost(run, expanded)
                if cost < incumbent:
                    plan, schedule, incumbent = found, expanded, cost
                if result.status == "OPTIMAL":  # nothing cheaper within the cap, so nowhere
                    lower = max(lower, result.objective)
                    continue
            else:
                go_on = False  # out of time under this cap
            # What the probe proved holds for schedules within its cap; the rest cost more.
            lower = max(lower, min(math.ceil(result.bound - 1e-6), cap + 1))
        if run.report:
            run.report(run.elapsed(), schedule.cost, lower * run.unit + run.offset)
        if not go_on:
            break
    return plan, schedule, min(lower, incumbent)


def _grown(step: int) -> int:
    """The climb's next step after a refuted cap."""
    return max(step + 1, round(CLIMB_GROWTH * step))


def _minimise(
    run: _Run,
    lm: LinearModel,
    lp: LpRelaxation,
    plan: StagePlan,
    schedule: IndexedSchedule,
    lower: int,
) -> tuple[StagePlan, IndexedSchedule, int]:
    """One CP-SAT run for the rest of the time: minimise under cap z (the incumbent's recompute
    cost) with the LP's fixings at z, starting from the incumbent as a complete hint, which its
    local search improves (demo resnet at 50%: 2.6e9 -> 5.4e8 FLOPs of recompute; without a
    first solution it found none in 40 s). On small or weak-LP models (FCN8, VGG, the demo
    graphs) this one run was as fast as capped probes and went further: demo unet at 50% was
    proven in 49 s, where probes of shares of the time ended at a 5.8% gap (the moment
    relaxation, which runs before it there since, proves it in 1 s)."""
    problem = run.problem
    incumbent = _recompute_cost(run, schedule)
    hint, fixed = hint_values(lm, problem, plan), reduced_cost_fixings(lm, lp, incumbent)
    result = CpSatModel(lm).solve(
        time_limit=run.remaining(),
        workers=run.workers,
        hint=hint,
        fixed=fixed,
        objective_cap=incumbent,
        progress=run.solver_progress(lower * run.unit + run.offset),
        scale=run.unit,
        offset=run.offset,
    )
    if result.values is not None:
        plan = plan_from_values(lm, problem.n, result.values.__getitem__)
        schedule = plan_to_ops(problem, plan)
        incumbent = _recompute_cost(run, schedule)
    if result.status == "OPTIMAL":
        return plan, schedule, incumbent
    if result.status == "UNKNOWN" or result.values is not None:
        lower = max(lower, min(math.ceil(result.bound - 1e-6), incumbent))
    return plan, schedule, lower


def _fits(run: _Run, schedule: IndexedSchedule, budget: int, cap: int) -> bool:
    """Whether the simulator accepts the schedule within the budget and its recompute cost is at
    most cap (a floating-point solver's answer is believed only after this)."""
    problem = run.problem
    replay = simulate(run.graph, [(kind, problem.ids[i]) for kind, i in schedule.ops])
    return replay.valid and replay.peak <= budget and _recompute_cost(run, schedule) <= cap


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
    heuristic_deadline = run.started + HEURISTIC_SHARE * run.time_limit
    evicted = least_peak(problem, compute_budget, deadline=heuristic_deadline)
    lower = float(problem.memory_lower_bound)
    # A node with its inputs needs `lower` bytes in any schedule: an eviction run that peaks
    # there is optimal, and the policies need not be evaluated (VGG19: 0.17 s).
    if evicted is not None and evicted.schedule.peak <= lower:
        return run.finish(evicted.schedule, "OPTIMAL", lower, compute_budget=compute_budget)
    warm = smallest_within([*all_members(problem), *filter(None, [evicted])], compute_budget)
    # checkpoint-all always fits a compute budget >= the total cost
    assert warm is not None, "no baseline fits a compute budget above the total cost"
    if warm.schedule.peak <= lower:
        return run.finish(warm.schedule, "OPTIMAL", lower, compute_budget=compute_budget)
    recompute_limit = None
    if compute_budget is not None:
        recompute_limit = int(compute_budget / run.unit + 1e-9) - sum(run.int_cost)
    if variable_count(problem, run.int_cost, recompute_limit) > MAX_MODEL_VARIABLES:
        return run.finish(warm.schedule, "FEASIBLE", lower, compute_budget=compute_budget)
    try:
        lm = build(problem, None, run.int_cost, recompute_limit, deadline=run.deadline)
    except TimeoutError:
        return run.finish(warm.schedule, "FEASIBLE", lower, compute_budget=compute_budget)
    hint = hint_values(lm, problem, warm.plan)
    result = CpSatModel(lm).solve(
        time_limit=run.remaining(),
        workers=run.workers,
        hint=hint,
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
