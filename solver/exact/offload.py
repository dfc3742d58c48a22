"""`solve(..., offload=link)`: the exact search of the stage space with offload (docs/offload.md).

    solve_with_offload(graph, budget, link)
      the one-line floor            a budget below it fits no schedule
      checkpoint-all                closes the search where it fits
      the model's size              counted, not built (`variable_count`)
      the keep/recompute solve      the incumbent (a share of the time), or the caller's
      CP-SAT on the offload model   capped at the incumbent, hinted with its plan; built only
                                    where its size suits the time left, and by the deadline
      the schedule                  replayed by the simulator over the link

"OPTIMAL" only where CP-SAT proves it (its solution's, or the incumbent's where it proves
nothing cheaper); otherwise "FEASIBLE" with CP-SAT's bound.
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
from solver.milp.offload import OffloadResult, OffloadTimes, solve_offload_model, variable_count

KEEP_RECOMPUTE_SHARE = 0.3
"""Share of the time limit the keep/recompute solve gets for the incumbent where the offload
model is built..."""

KEEP_RECOMPUTE_ALONE_SHARE = 0.9
"""...and where it is too large for the time left (`offload_model_room`): the incumbent is
then the result."""


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
    `KEEP_RECOMPUTE_SHARE` of the time). The offload model is built only where its variables
    are within `offload_model_room` of the time left, and within the deadline; otherwise the
    incumbent comes back, "FEASIBLE" with the cost of computing every node once as its bound.
    Raises InfeasibleBudgetError where no schedule fits (below the one-line floor, or proven by
    CP-SAT) and SolverTimeoutError where none is found in time."""
    from solver.exact.pipeline import solve  # the keep/recompute solve; imports this module

    started = time.perf_counter()
    floor = max(problem.compute_floor(v) for v in range(problem.n))
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
    room = offload_model_room(options, deadline.remaining() * (1 - KEEP_RECOMPUTE_SHARE))
    size = variable_count(problem, link, above=room)
    if start is None:
        share = KEEP_RECOMPUTE_SHARE if size <= room else KEEP_RECOMPUTE_ALONE_SHARE
        try:
            start = solve(
                graph,
                budget,
                time_limit=share * deadline.remaining(),
                workers=workers,
                deadline=deadline,
                options=options,
            )
        except (InfeasibleBudgetError, SolverTimeoutError):
            start = None
    hint = None if start is None else _stage_plan(problem, start.ops)
    cap = None if hint is None else sum(times.cost[i] for stage in hint.computed for i in stage)
    left = deadline.remaining()
    room = offload_model_room(options, left)
    if size > room:
        result = OffloadResult("UNKNOWN", None, None, 0)
        no_model = (
            f"the exact offload model would have more than {room} variables, too many for the "
            f"{left:.1f} s left (SolveOptions.model_variables_per_second = "
            f"{options.model_variables_per_second}, max_model_variables = "
            f"{options.max_model_variables}); raise the time limit"
        )
    else:
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
        no_model = "the exact offload model was not solved in the time left"
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
    # every node is computed at least once: the bound where CP-SAT proved nothing more
    bound = max(times.units.to_graph(result.bound), problem.total_cost)
    if result.plan is None or (cap is not None and result.objective == cap):
        if start is None:
            raise SolverTimeoutError(
                f"no schedule within {human_bytes(budget)} was found in the time limit, with "
                f"offload or without ({no_model}); raise the time limit (--time-limit) or the "
                "budget",
                cost_bound=bound,
            )
        status = "OPTIMAL" if result.status == "OPTIMAL" else "FEASIBLE"
        ops = [(kind, problem.index[v]) for kind, v in start.ops]
        return _schedule(graph, problem, ops, link, budget, status, bound, started)
    ops = offload_ops(problem, result.plan)
    schedule = _schedule(graph, problem, ops, link, budget, result.status, bound, started)
    _check_accounting(schedule, result.objective, times)
    return schedule


def offload_model_room(options: SolveOptions, seconds: float) -> int:
    """The most variables an offload model may have to be built and solved in `seconds`: as
    for the stage model (`solver.exact.stage_model`), `SolveOptions.model_variables_per_second`
    per second, at most `SolveOptions.max_model_variables` (building one takes about half of
    that time: 21,000 variables per second on `benchmarks.zoo.resnet50`'s module graph)."""
    return min(options.max_model_variables, int(options.model_variables_per_second * seconds))


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
