"""`solve(..., offload=link)`: the exact search of the stage space with offload (docs/offload.md).

    solve_with_offload(graph, budget, link)
      the one-line floor            a budget below it fits no schedule
      checkpoint-all                closes the search where it fits
      the keep/recompute solve      the incumbent (a share of the time), or the caller's
      the model's size              too many variables for the time left, or for
                                    `SolveOptions.max_model_variables`: the incumbent comes back
      CP-SAT on the offload model   capped at the incumbent, hinted with its plan
      the schedule                  replayed by the simulator over the link

"OPTIMAL" only where CP-SAT proves it (its solution's, or the incumbent's where it proves
nothing cheaper); otherwise "FEASIBLE" with CP-SAT's bound, or, where the model was not built,
with the cost of computing every node once (every schedule computes each node, and waits no
less than nothing) and `extra["offload_model"]` saying why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Sequence

import networkx as nx

from solver.core.budget import human_bytes
from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import offload_ops
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import StagePlan, checkpoint_all
from solver.deadline import Deadline
from solver.errors import (
    InfeasibleBudgetError,
    InvalidScheduleError,
    SolverTimeoutError,
)
from solver.exact.options import DEFAULT, SolveOptions
from solver.milp.cpsat import ProgressFn
from solver.milp.offload import OffloadTimes, solve_offload_model, variable_count

KEEP_RECOMPUTE_SHARE = 0.3
"""Share of the time limit the keep/recompute solve gets for the incumbent."""


def solve_with_offload(
    graph: nx.DiGraph,
    problem: Problem,
    budget: int,
    link: Link,
    deadline: Deadline,
    *,
    workers: int = 8,
    progress: ProgressFn | None = None,
    start: Schedule | None = None,
    options: SolveOptions = DEFAULT,
) -> Schedule:
    """The least-cost schedule with offload over `link` within `budget` bytes, by `deadline`.
    `start`: a keep/recompute schedule for the budget (the caller's; else one is solved in
    `KEEP_RECOMPUTE_SHARE` of the time left, none where none is left). `options`: the
    keep/recompute solve's, and the model's size limits (`max_model_variables`,
    `model_variables_per_second` of the time left after the incumbent). Raises
    InfeasibleBudgetError where no schedule fits (below the one-line floor, or proven by
    CP-SAT) and SolverTimeoutError where none is found in time."""
    from solver.exact.pipeline import solve  # the keep/recompute solve; imports this module

    started, began = time.perf_counter(), deadline.remaining()
    floor = problem.one_line_floor
    if budget < floor:
        raise InfeasibleBudgetError(
            f"no schedule fits a budget of {budget} bytes ({human_bytes(budget)}), with offload "
            f"or without: a node's inputs, output and transient bytes need {floor} bytes "
            f"({human_bytes(floor)}); raise the budget to at least that",
            minimum_bytes=None,
            lower_bound_bytes=floor,
        )
    times = OffloadTimes.of(problem, link)
    everything = checkpoint_all(problem)
    if everything.peak <= budget:
        return _schedule(graph, problem, everything.ops, link, budget, "OPTIMAL", None, started)
    if start is None and began > 0:
        try:
            start = solve(
                graph,
                budget,
                time_limit=KEEP_RECOMPUTE_SHARE * began,
                workers=workers,
                options=options,
                deadline=deadline,
            )
        except (InfeasibleBudgetError, SolverTimeoutError):
            start = None
    unbuilt = _too_large(problem, link, options, deadline)
    if unbuilt:
        once = problem.total_cost
        if start is None:
            raise SolverTimeoutError(
                f"no schedule within {human_bytes(budget)} was found in the time limit, with "
                f"offload or without ({unbuilt}); raise the time limit (--time-limit) or the "
                "budget",
                cost_bound=once,
            )
        ops = [(kind, problem.index[v]) for kind, v in start.ops]
        schedule = _schedule(graph, problem, ops, link, budget, "FEASIBLE", once, started)
        schedule.extra["offload_model"] = unbuilt
        return schedule
    hint = None if start is None else _stage_plan(problem, start.ops)
    cap = None if hint is None else sum(times.cost[i] for stage in hint.computed for i in stage)
    result = solve_offload_model(
        problem,
        budget,
        link,
        times,
        deadline=deadline,
        workers=workers,
        cap=cap,
        hint=hint,
        progress=None if progress is None else _in_graph_units(progress, times),
    )
    if result.status == "INFEASIBLE" and cap is not None:
        raise InvalidScheduleError(
            "internal error: the offload model refutes the keep/recompute schedule's own cost; "
            "please report this"
        )
    if result.status == "INFEASIBLE":
        raise InfeasibleBudgetError(
            f"no schedule with offload fits a budget of {budget} bytes ({human_bytes(budget)}) "
            f"over this link (proven in the stage space with offload, docs/offload.md); raise "
            "the budget",
            minimum_bytes=None,
            lower_bound_bytes=floor,
        )
    bound = times.units.to_graph(result.bound)
    if result.plan is None or (cap is not None and result.objective == cap):
        if start is None:
            raise SolverTimeoutError(
                f"no schedule within {human_bytes(budget)} was found in the time limit, with "
                "offload or without; raise the time limit (--time-limit) or the budget",
                cost_bound=bound,
            )
        status = "OPTIMAL" if result.status == "OPTIMAL" else "FEASIBLE"
        ops = [(kind, problem.index[v]) for kind, v in start.ops]
        return _schedule(graph, problem, ops, link, budget, status, bound, started)
    ops = offload_ops(problem, result.plan)
    schedule = _schedule(graph, problem, ops, link, budget, result.status, bound, started)
    _check_accounting(schedule, result.objective, times)
    return schedule


def _too_large(problem: Problem, link: Link, options: SolveOptions, deadline: Deadline) -> str:
    """Why the offload model is not built (its variables over `max_model_variables`, or over
    `model_variables_per_second` times the seconds left); "" where it is."""
    left = deadline.remaining()
    room = min(options.max_model_variables, int(options.model_variables_per_second * left))
    size = variable_count(problem, link, above=options.max_model_variables)
    if size <= room:
        return ""
    if size > options.max_model_variables:
        return (
            f"the offload model would have more than {options.max_model_variables} variables "
            "(SolveOptions.max_model_variables; it grows as the square of the nodes): solve a "
            "smaller graph (graph_capture granularity='module', or a part of the model)"
        )
    return (
        f"the offload model would have more than {room} variables, too many for the "
        f"{left:.1f} s left (SolveOptions.model_variables_per_second = "
        f"{options.model_variables_per_second}); raise the time limit"
    )


def _schedule(
    graph: nx.DiGraph,
    problem: Problem,
    ops: Sequence[tuple[str, int]],
    link: Link,
    budget: int,
    status: str,
    bound: float | None,
    started: float,
) -> Schedule:
    """The schedule of `ops`, replayed over `link`: "OPTIMAL" with its own cost as the bound,
    else "FEASIBLE" with `bound` (at most its cost)."""
    schedule = make_schedule(
        graph, problem, ops, method="exact", budget=budget, link=link, status="FEASIBLE"
    )
    if status == "OPTIMAL":
        schedule.status, schedule.bound = "OPTIMAL", schedule.cost
    else:
        schedule.bound = None if bound is None else min(bound, schedule.cost)
    if schedule.peak > budget:
        raise InvalidScheduleError(
            f"internal error: the offload schedule peaks at {schedule.peak} bytes, over the "
            f"budget of {budget}; please report this"
        )
    schedule.solve_seconds = time.perf_counter() - started
    return schedule


def _check_accounting(schedule: Schedule, objective: int | None, times: OffloadTimes) -> None:
    """The simulator's cost of the model's plan is at most the model's objective (its least
    timeline; equal where CP-SAT proved it), to the rounding of the units."""
    assert objective is not None
    model = times.units.to_graph(objective)
    slack = 0.0 if times.exact else len(schedule.ops) * times.units.to_graph(1)
    tolerance = 1e-9 * max(1.0, abs(model)) + slack
    proven = schedule.status == "OPTIMAL"
    if schedule.cost > model + tolerance or (proven and schedule.cost < model - tolerance):
        raise InvalidScheduleError(
            f"internal error: the offload model's timeline ({model:g}) disagrees with the "
            f"simulator's ({schedule.cost:g}); please report this"
        )


def _stage_plan(problem: Problem, ops: Sequence[tuple[str, Hashable]]) -> StagePlan:
    """The stage plan of a keep/recompute schedule's ops: stage t runs to the first compute of
    node t and the frees after it; what is live then is carried into t + 1."""
    computed: list[tuple[int, ...]] = []
    kept: list[frozenset[int]] = [frozenset()]
    live: set[int] = set()
    stage: list[int] = []
    seen: set[int] = set()
    boundary = False
    for kind, v in ops:
        i = problem.index[v]
        if boundary and kind == "compute":
            computed.append(tuple(sorted(stage)))
            kept.append(frozenset(live))
            stage, boundary = [], False
        if kind == "compute":
            stage.append(i)
            live.add(i)
            boundary = i not in seen
            seen.add(i)
        else:
            live.discard(i)
    computed.append(tuple(sorted(stage)))
    kept.append(frozenset())
    return StagePlan(tuple(computed), tuple(kept))


def _in_graph_units(progress: ProgressFn, times: OffloadTimes) -> ProgressFn:
    """`progress` fed the model's (seconds, objective, bound) in graph units."""

    def report(seconds: float, objective: float, bound: float) -> None:
        graph_bound = times.units.to_graph(bound) if math.isfinite(bound) else bound
        progress(seconds, times.units.to_graph(objective), graph_bound)

    return report
