"""`solve`: the exact search as a pipeline of steps over one search state.

    solve(graph, budget)
      Search(...)                     the state: incumbent, floor, deadline, cost units
      warm_start.begin                checkpoint-all; closed where it fits; infeasible budgets
      COST_STEPS, in order, while the search is open and the deadline has not passed:
        warm_start.warm_start         eviction, backward search, checkpoint policies
        cover.read_gap_cover          a floor and a plan without the stage model
        cascade.cascade_cover         where recomputes cascade: a floor, and lifetime plans
        moments.moment_relaxation     where the first overflow is late: the relaxation first
        stage_model.stage_model       the stage model at the incumbent's cost
        stage_model.lp_relaxation     its LP bound, roundings, rebuilt while they improve
        probes.probes                 HiGHS's climbing caps, the relaxation, CP-SAT
        cascade.lifetime_polish       the lifetime search from the incumbent, to the deadline
      finish                          the schedule, replayed and checked, with its proof

Objective "memory" runs `least_peak.begin` and `least_peak.STEPS` the same way; the budget "min"
runs that, then the steps of objective "cost" at the peak it found. Each step is a
function that takes the state (`solver.exact.state.Search`) and returns it; the invariants it
may rely on are the named notes of `solver.exact.state`. Adding a step (a bound, a presolve, a
warm start) is writing one such function and listing it in COST_STEPS (or passing
`SolveOptions(steps=...)`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import networkx as nx

from solver.core.budget import Budget, human_bytes, hundred_percent, parse_compute_budget
from solver.core.graph import prepare
from solver.core.link import Link
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import Member
from solver.deadline import Deadline, Stop, check_time_limit
from solver.errors import ArgumentError, InternalError, SolverTimeoutError
from solver.exact import least_peak, warm_start
from solver.exact.cascade import cascade_cover, lifetime_polish
from solver.exact.cover import read_gap_cover
from solver.exact.moments import moment_relaxation
from solver.exact.offload.search import OffloadProblem, solve_with_offload
from solver.exact.options import DEFAULT, SolveOptions
from solver.exact.probes import probes
from solver.exact.stage_model import lp_relaxation, stage_model
from solver.exact.state import Goal, Search, run_steps
from solver.interrupt import first_sigint_stops
from solver.milp.cpsat import ProgressFn, print_progress
from solver.milp.units import CostUnits
from solver.spelling import spelled
from solver.target.devices import host_link

COST_STEPS = (
    warm_start.warm_start,
    read_gap_cover,
    cascade_cover,
    moment_relaxation,
    stage_model,
    lp_relaxation,
    probes,
    lifetime_polish,
)
"""The steps of objective "cost", in order, after `warm_start.begin`."""


@spelled
def solve(
    graph: nx.DiGraph,
    budget: Budget | int | str | None = None,
    *,
    objective: str = "cost",
    compute_budget: float | str | None = None,
    time_limit: float = 60.0,
    workers: int = 8,
    progress: ProgressFn | bool | None = None,
    options: SolveOptions = DEFAULT,
    deadline: Deadline | None = None,
    offload: Link | str | None = None,
) -> Schedule:
    """The optimal schedule in the Checkmate stage space, or the best found by `time_limit`.

    Args:
        graph: DAG with `mem` (bytes), `cost` and optionally `transient` (bytes) on every node
            (see `solver.core.graph`).
        budget: peak-memory budget for objective="cost" (`solver.core.budget.Budget`): bytes,
            or text like "512MiB" / "80%" (of the measured plain step where the graph has
            `plain_peak`, else of the checkpoint-all peak), or "min": the least peak (within
            `compute_budget`), found with `TimeShares.least_peak` of the time, then the least
            cost at that peak with the rest (`extra["least_peak"]`: the status and bound of the
            least-peak search; where the second search finds nothing in time, the least-peak
            schedule, "FEASIBLE"). None means unconstrained. With objective="memory" it must be None
            (ArgumentError), as compute_budget must be with objective="cost" but for "min".
        objective: "cost" (least total cost with peak <= budget) or "memory" (least peak with
            total cost <= compute_budget).
        compute_budget: for objective="memory" and for "min": a factor of computing every node
            once (1.2 or "1.2x"), or an absolute cost "0.02units" (`solver.core.budget`). None
            means unlimited.
        time_limit: seconds, for everything (heuristics, bounds, models, the error paths): the
            call returns by then plus what one engine call overruns its own limit (`python -m
            benchmarks.solving.time_limits` measures it). At the limit the best schedule found comes
            back with status "FEASIBLE" and its proven bound.
        workers: CP-SAT search workers (more than the cores still helps: the portfolio differs).
        progress: True to print each improvement to stderr, or a ProgressFn (seconds, objective,
            bound), in graph units (bytes for objective "memory").
        options: the search's tuning (`SolveOptions`).
        deadline: the caller's deadline, for a solve that is one step of a longer piece of work
            (`solver.fitting.search`): the solve ends by the earlier of it and `time_limit`,
            and when its stop is requested (the caller's Ctrl-C).
        offload: a host link (`solver.Link`, or a link's or built-in target's name: "pcie5",
            "h100", as `solver.target.devices.host_link` reads it): values may also be
            offloaded and reloaded over it, and the schedule is the optimum of the stage space
            with offload, its cost the compute cost plus the stall (docs/offload.md;
            `solver.exact.offload.search`; objective "cost" only). None: keep or recompute only.

    Returns a `Schedule` replayed by the independent simulator, within the budgets; status
    "OPTIMAL" only with an exact certificate (NOTE [certificates] in `solver.exact.state`), its
    `extra["steps"]` the steps that ran with their seconds and findings.

    Ctrl-C (`solver.interrupt`; from the main thread, where SIGINT has Python's default
    handler): the first stops the search, and the call returns the best schedule found as at
    the time limit ("FEASIBLE" with its proven bound, or "OPTIMAL" if proven by then) with
    `extra["interrupted"]` True; a second raises KeyboardInterrupt.

    Raises:
        InfeasibleBudgetError: no schedule fits the budget (names the minimum when it is found).
        ComputeBudgetError: objective="memory" and the compute budget is below the total cost.
        SolverTimeoutError: no schedule within the budget was found within the time limit.

    Exception to the 8-parameter and 80-line rules: a public entry point whose keyword-only
    parameters are the one interface's options, each documented here.
    """
    started = time.perf_counter()
    wanted = check_arguments(objective, budget, compute_budget, offload)
    check_time_limit(time_limit)
    least = wanted is not None and wanted.least
    link = None if offload is None else host_link(offload)
    problem = prepare(graph)
    units = CostUnits.of(problem)
    limit = None if compute_budget is None else parse_compute_budget(compute_budget, problem)
    stop = Stop() if deadline is None or deadline.stop is None else deadline.stop
    at = started + time_limit if deadline is None else min(deadline.at, started + time_limit)
    report = print_progress if progress is True else (progress or None)

    def run(goal: Goal, until: Deadline, seed: Member | None = None) -> Search:
        search = Search(graph, problem, goal, options, workers, until, time_limit, started, report)
        if goal.objective == "cost":
            steps = COST_STEPS if options.steps is None else tuple(options.steps)
            begun = warm_start.begin(search)
            begun.offer(seed)
            return run_steps(begun, steps)
        steps = least_peak.STEPS if options.steps is None else tuple(options.steps)
        return run_steps(least_peak.begin(search), steps)

    whole = Deadline(at, stop)
    with first_sigint_stops(stop, print_interrupted if progress is True else None):
        if least:
            return _least_then_cheapest(run, units, limit, whole, options.shares.least_peak)
        if objective == "memory":
            return finish(run(Goal("memory", units, compute_budget=limit), whole))
        bytes_ = None if wanted is None else wanted.bytes(lambda: hundred_percent(problem)[0])
        if link is not None:
            assert bytes_ is not None
            return solve_with_offload(
                OffloadProblem(graph, problem, bytes_, link),
                whole,
                workers=workers,
                progress=report,
                options=options,
                keep_recompute=solve,
            ).schedule
        return finish(run(Goal("cost", units, budget=bytes_), whole))


def check_arguments(
    objective: str,
    budget: Budget | int | str | None,
    compute_budget: float | str | None,
    offload: object,
    name: Callable[..., str] | None = None,
) -> Budget | None:
    """`solve`'s arguments that do not go together refused (ArgumentError), in `name`'s
    spelling of them: ``name(parameter)`` and ``name(parameter, value)`` (the parameter's
    spelling alone and given that value; `remat solve` spells them as its options). Returns
    `budget` read (`Budget.of`; None where None)."""
    name = name or _parameter
    if objective not in ("cost", "memory"):
        raise ArgumentError(f"{name('objective')} must be 'cost' or 'memory', not {objective!r}")
    if objective == "memory" and budget is not None:
        raise ArgumentError(
            f"{name('budget')} is for {name('objective', 'cost')}; "
            f"{name('objective', 'memory')} minimises the peak (bound its recomputation with "
            f"{name('compute_budget')})"
        )
    wanted = None if budget is None else Budget.of(budget)
    least = wanted is not None and wanted.least
    if objective == "cost" and compute_budget is not None and not least:
        raise ArgumentError(
            f"{name('compute_budget')} is for {name('objective', 'memory')} or "
            f"{name('budget', 'min')}; give {name('budget')} instead"
        )
    if offload is not None and (objective != "cost" or wanted is None or least):
        given = f", not {name('budget', 'min')}" if least else ""
        raise ArgumentError(
            f"{name('offload')} is for {name('objective', 'cost')} at a {name('budget')} in "
            f"bytes or percent{given}"
        )
    return wanted


def _parameter(parameter: str, value: str | None = None) -> str:
    """`solve`'s spelling of a parameter, or of it given `value`: budget, objective 'cost'."""
    return parameter if value is None else f"{parameter} {value!r}"


def _least_then_cheapest(
    run: Callable[..., Search],
    units: CostUnits,
    compute_budget: float | None,
    deadline: Deadline,
    share: float,
) -> Schedule:
    """The budget "min": the least peak (cost within `compute_budget`, graph units) by `share`
    of the time left (`TimeShares.least_peak`), then the least cost at that peak by
    `deadline`. The second search starts from the least-peak schedule, so that what it returns
    costs at most as much (and stays within `compute_budget`) even where it stops at its
    deadline ("FEASIBLE")."""
    first = run(Goal("memory", units, compute_budget=compute_budget), deadline.share(share))
    least = finish(first)
    schedule = finish(run(Goal("cost", units, budget=least.peak), deadline, first.incumbent))
    schedule.compute_budget = compute_budget
    schedule.extra["least_peak"] = {"status": least.status, "bound": least.bound}
    schedule.extra["interrupted"] = deadline.stopped()
    return schedule


def print_interrupted() -> None:
    """The notice of the first Ctrl-C (stderr): the solve ends with what it found."""
    print(
        "  interrupted: returning the best schedule found (Ctrl-C again to abort)",
        file=sys.stderr,
    )


def finish(search: Search) -> Schedule:
    """The incumbent as a `Schedule`: "OPTIMAL" when the search is closed, else "FEASIBLE" with
    the floor as its bound. The warm starts still pending are evaluated first (within their
    deadlines) unless the search is closed. The schedule is replayed by the simulator and
    checked against the budgets (NOTE [checked]); without an incumbent, SolverTimeoutError says
    what to change."""
    if not search.closed:
        search.run_pending()
    goal, incumbent = search.goal, search.incumbent
    if incumbent is None:
        assert goal.budget is not None  # checkpoint-all fits every other goal
        raise SolverTimeoutError(
            _nothing_fits(search, goal.budget), cost_bound=goal.units.graph_cost(search.floor)
        )
    optimal = search.closed
    schedule = make_schedule(
        search.graph,
        search.problem,
        incumbent.schedule,
        method="exact",
        objective=goal.objective,
        status="OPTIMAL" if optimal else "FEASIBLE",
        bound=None,
        budget=goal.budget,
        compute_budget=goal.compute_budget,
        extra={
            "cost_unit": goal.units.unit,
            "found_by": incumbent.param,
            "steps": search.trace,
            "interrupted": search.deadline.stopped(),
        },
    )
    value = schedule.cost if goal.objective == "cost" else float(schedule.peak)
    schedule.bound = value if optimal else min(value, goal.in_graph_units(search.floor))
    if not (goal.fits(incumbent) and _within_budgets(schedule)):
        raise InternalError(
            f"the schedule found ({incumbent.param}) does not meet the budgets when replayed "
            f"(peak {schedule.peak}, cost {schedule.cost:g})"
        )
    schedule.solve_seconds = search.elapsed()
    return schedule


def _nothing_fits(search: Search, budget: int) -> str:
    """The message when no schedule within `budget` bytes was found: what is known (the least
    peak the heuristics reach, the proven recomputation, why the stage model was not built) and
    what to change."""
    units, peak = search.goal.units, search.heuristic_peak
    proven = units.graph_cost(search.floor) - units.graph_cost(0)
    known = []
    advice = "raise the time limit (--time-limit) or the budget"
    if peak is not None:
        known.append(f"the least peak the heuristics reach is {human_bytes(peak)}")
        advice += f" (at {peak} bytes a heuristic's schedule fits)"
    if proven:
        known.append(f"any schedule recomputes at least {proven:g} cost units")
    if search.no_model:
        known.append(search.no_model)
    when = (
        f"before the interrupt at {search.elapsed():.1f} s"
        if search.deadline.stopped()
        else f"in {search.time_limit:g} s"
    )
    return (
        f"no schedule within {human_bytes(budget)} was found {when} and no "
        "heuristic fits that budget" + "".join(f"; {fact}" for fact in known) + f"; {advice}"
    )


def _within_budgets(schedule: Schedule) -> bool:
    """The replayed schedule's peak and cost against the budgets it was solved for."""
    peak_ok = schedule.budget is None or schedule.peak <= schedule.budget
    limit = schedule.compute_budget
    return peak_ok and (limit is None or schedule.cost <= limit * (1 + 1e-12))
