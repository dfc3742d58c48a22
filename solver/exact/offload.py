"""`solve(..., offload=link)`: the exact search of the stage space with offload (docs/offload.md).

    solve_with_offload(OffloadProblem(graph, problem, budget, link), deadline)
      the one-line floor            a budget below it fits no schedule
      (keep/recompute first)        where the caller asks for it (`remat solve --offload`, which
                                    prints it as a row of its own), the keep/recompute solve
      checkpoint-all                closes the search where it fits
      offload heuristics            from checkpoint-all (`solver.heuristics.offload`); one at
                                    the cost of computing every node once closes the search
      the model's size              counted, not built (`variable_count`), up to
                                    `SolveOptions.max_model_variables`
      the keep/recompute solve      a share of the time, or the caller's schedule
      offload heuristics            from its plan; the incumbent: the cheapest run that fits,
                                    the keep/recompute schedule among them
      CP-SAT on the offload model   capped at the incumbent, hinted with its plan; built only
                                    where its size suits the time left, and by the deadline
      the schedule                  CP-SAT's where cheaper than the incumbent, else the
                                    incumbent; replayed by the simulator over the link

"OPTIMAL" only where proven: by CP-SAT (its solution's, or the incumbent's where that costs no
more), or by an incumbent at the compute cost; otherwise "FEASIBLE" with CP-SAT's bound, at
least the cost of computing every node once. Where the model was not built (over
`max_model_variables`, or too large for the time left), `extra["offload_model"]` of the schedule
says why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import networkx as nx

from solver.core.budget import human_bytes
from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import OffloadPlan, offload_ops
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import StagePlan, plan_from_keep, plan_to_ops
from solver.deadline import Deadline
from solver.errors import (
    InfeasibleBudgetError,
    InternalError,
    RematError,
    SolverTimeoutError,
)
from solver.exact.options import DEFAULT, SolveOptions
from solver.heuristics.offload import OffloadRun, offload_runs
from solver.milp.cpsat import ProgressFn
from solver.milp.offload.model import variable_count
from solver.milp.offload.solve import Incumbent, OffloadResult, solve_offload_model
from solver.milp.offload.times import OffloadTimes


@dataclass(frozen=True)
class OffloadProblem:
    """What a solve with offload is asked: `graph`, its prepared `problem`, the `budget`
    (bytes) and the host `link` values are offloaded over."""

    graph: nx.DiGraph
    problem: Problem
    budget: int
    link: Link


@dataclass(frozen=True)
class OffloadSolve:
    """What `solve_with_offload` found: the `schedule` with offload, and the keep/recompute
    schedule it started from (`start`, the caller's or solved; None where there was none), or
    the error that ended the keep/recompute solve (`InfeasibleBudgetError`,
    `SolverTimeoutError`; None where it found one or did not run)."""

    schedule: Schedule
    keep_recompute: Schedule | None = None
    keep_recompute_error: RematError | None = None


def solve_with_offload(
    asked: OffloadProblem,
    deadline: Deadline,
    *,
    workers: int = 8,
    progress: ProgressFn | None = None,
    start: Schedule | None = None,
    options: SolveOptions = DEFAULT,
    keep_recompute: Callable[..., Schedule] | None = None,
    keep_recompute_first: bool = False,
) -> OffloadSolve:
    """The least-cost schedule with offload over `asked.link` within `asked.budget` bytes, by
    `deadline`: never costlier than the offload heuristics' runs that fit, nor than the
    keep/recompute schedule `start` (the caller's; else one is solved by `keep_recompute`,
    `solver.solve` without offload, in `TimeShares.offload_keep_recompute` of the time left; none
    where no time is left or `keep_recompute` is None). `keep_recompute_first` (with
    `keep_recompute` and no `start`): the keep/recompute solve runs first, in
    `TimeShares.command_keep_recompute` of the time left, also where checkpoint-all or an
    offload heuristic would close the search without it (`remat solve --offload` prints its
    schedule as a row of its own). `progress` sees the keep/recompute solve's incumbents, then
    the offload model's. The offload model is built only where its variables are within
    `offload_model_room` of the time left, and within the deadline; otherwise the incumbent
    comes back, "FEASIBLE" with the cost of computing every node once as its bound (graph
    units), and `extra["offload_model"]` saying why where its size kept the model from being
    built. Raises InfeasibleBudgetError where no schedule fits (below the one-line floor, or
    proven by CP-SAT) and SolverTimeoutError where none is found in time.

    Returns an `OffloadSolve`: the schedule, which as every exact schedule lists in
    `extra["steps"]` the steps that ran (`_Steps`: each one's seconds and findings) and says in
    `extra["interrupted"]` whether `deadline`'s stop was requested (the first Ctrl-C: the best
    schedule found by then comes back), and the keep/recompute solve's schedule or error."""
    search = _OffloadSearch(asked, deadline, workers, progress, options, keep_recompute)
    if start is None and keep_recompute is not None and keep_recompute_first:
        search.check_floor()
        start = search.solve_keep_recompute(options.shares.command_keep_recompute)
    schedule = search.run(start)
    schedule.extra["steps"] = search.steps.trace
    schedule.extra["interrupted"] = deadline.stopped()
    return OffloadSolve(schedule, start, search.keep_recompute_error)


class _Steps:
    """The steps of an offload solve as they end: `done(step, **facts)` records the step's
    seconds since the previous one ended (or the solve began) and what it found."""

    def __init__(self) -> None:
        self.trace: list[dict] = []
        self._at = time.perf_counter()

    def done(self, step: str, **facts: object) -> None:
        now = time.perf_counter()
        self.trace.append({"step": step, "seconds": now - self._at, **facts})
        self._at = now


class _OffloadSearch:
    """`solve_with_offload`'s steps over one state: the heuristic runs so far (`runs`), the
    cheapest that fits (`incumbent`), each step recorded in `steps`."""

    def __init__(
        self,
        asked: OffloadProblem,
        deadline: Deadline,
        workers: int,
        progress: ProgressFn | None,
        options: SolveOptions,
        keep_recompute: Callable[..., Schedule] | None,
    ) -> None:
        self.started = time.perf_counter()
        self.asked, self.graph, self.problem = asked, asked.graph, asked.problem
        self.budget, self.link = asked.budget, asked.link
        self.deadline, self.workers, self.progress = deadline, workers, progress
        self.options, self.keep_recompute = options, keep_recompute
        self.steps = _Steps()
        self.runs: list[OffloadRun] = []
        self.incumbent: OffloadRun | None = None
        self.keep_recompute_solved = False
        self.keep_recompute_error: RematError | None = None

    def run(self, start: Schedule | None) -> Schedule:
        """The schedule (module docstring's steps, in order)."""
        problem, budget, deadline = self.problem, self.budget, self.deadline
        shares = self.options.shares
        self.check_floor()
        everything = plan_from_keep(problem, range(problem.n))
        indexed = plan_to_ops(problem, everything)
        self.steps.done("checkpoint-all", peak=indexed.peak, fits=indexed.peak <= budget)
        if indexed.peak <= budget:
            return self._schedule(indexed.ops, "OPTIMAL", None)
        self._add_runs(
            "checkpoint-all",
            offload_runs(
                self.graph,
                problem,
                budget,
                self.link,
                {"checkpoint-all": everything},
                deadline.share(shares.offload_heuristics),
            ),
        )
        if _at_compute_cost(self.incumbent, problem):
            return self._run_schedule(self.incumbent, "OPTIMAL", None)
        room = offload_model_room(
            self.options, deadline.remaining() * (1 - shares.offload_keep_recompute)
        )
        size = variable_count(problem, self.link, above=self.options.max_model_variables)
        solves = not self.keep_recompute_solved and self.keep_recompute is not None
        if start is None and solves and deadline.remaining() > 0:
            share = (
                shares.offload_keep_recompute
                if size <= room
                else shares.offload_keep_recompute_alone
            )
            start = self.solve_keep_recompute(share)
        if start is not None:
            self._add_runs(
                "keep/recompute",
                _from_start(
                    self.graph,
                    problem,
                    budget,
                    self.link,
                    start,
                    deadline.share(shares.offload_heuristics),
                ),
            )
        if _at_compute_cost(self.incumbent, problem):
            return self._run_schedule(self.incumbent, "OPTIMAL", None)
        return self._solve_model(size)

    def check_floor(self) -> None:
        """InfeasibleBudgetError where the budget is below the one-line floor."""
        floor, budget = self.problem.one_line_floor, self.budget
        if budget < floor:
            raise InfeasibleBudgetError(
                f"no schedule fits a budget of {budget} bytes ({human_bytes(budget)}), with "
                f"offload or without: a node's inputs, output and transient bytes need {floor} "
                f"bytes ({human_bytes(floor)}); raise the budget to at least that",
                minimum_bytes=None,
                lower_bound_bytes=floor,
            )

    def _add_runs(self, base: str, runs: list[OffloadRun]) -> None:
        """The offload heuristics' `runs` from `base` added; the incumbent the cheapest."""
        self.runs += runs
        self.incumbent = _cheapest(self.runs, self.budget)
        self.steps.done(f"offload heuristics from {base}", **_found(self.runs, self.incumbent))

    def solve_keep_recompute(self, share: float) -> Schedule | None:
        """The keep/recompute schedule solved in `share` of the time left (None where none is
        found: infeasible, or not in time: `keep_recompute_error` says which)."""
        assert self.keep_recompute is not None
        self.keep_recompute_solved = True
        try:
            start = self.keep_recompute(
                self.graph,
                self.budget,
                time_limit=share * self.deadline.remaining(),
                workers=self.workers,
                progress=self.progress,
                deadline=self.deadline,
                options=self.options,
            )
        except (InfeasibleBudgetError, SolverTimeoutError) as error:
            self.keep_recompute_error = error
            self.steps.done("keep/recompute", found=type(error).__name__)
            return None
        self.steps.done("keep/recompute", status=start.status, cost=start.cost)
        return start

    def _solve_model(self, size: int) -> Schedule:
        """The offload model of `size` variables solved (where it suits the time left), capped
        at the incumbent; its schedule where cheaper, else the incumbent's."""
        problem, budget, incumbent = self.problem, self.budget, self.incumbent
        times = OffloadTimes.of(problem, self.link)
        cap = None if incumbent is None else _model_units(incumbent, times)
        left = self.deadline.remaining()
        room = offload_model_room(self.options, left)
        tried = size <= room
        if not tried:
            result = OffloadResult("UNKNOWN", None, None, 0)
            no_model = (
                "interrupted before the exact offload model was built"
                if self.deadline.stopped()
                else _too_large(size, room, left, self.options)
            )
            self.steps.done("offload model", variables=size, built=False)
        else:
            result = solve_offload_model(
                problem,
                budget,
                self.link,
                times,
                deadline=self.deadline,
                workers=self.workers,
                incumbent=Incumbent(cap, None if incumbent is None else incumbent.plan),
                progress=None if self.progress is None else _in_graph_units(self.progress, times),
            )
            no_model = "the exact offload model was not solved in the time left"
            self.steps.done("offload model", variables=size, built=True, status=result.status)
        self._check_feasible(result, cap)
        # every node is computed at least once: the bound where CP-SAT proved nothing more
        bound = max(times.units.to_graph(result.bound), problem.total_cost)
        found = None
        if result.plan is not None:
            ops = offload_ops(problem, result.plan)
            found = self._schedule(ops, result.status, bound)
            _check_accounting(found, result.objective, times)
        if found is not None and (incumbent is None or found.cost < incumbent.cost - _slack(found)):
            return found
        if incumbent is None:
            raise self._nothing_found(no_model, bound)
        # CP-SAT's proof holds for the incumbent too: it costs no more than CP-SAT's optimum
        status = "OPTIMAL" if result.status == "OPTIMAL" else "FEASIBLE"
        schedule = self._run_schedule(incumbent, status, bound)
        if not tried:
            schedule.extra["offload_model"] = no_model
        return schedule

    def _check_feasible(self, result: OffloadResult, cap: int | None) -> None:
        """InfeasibleBudgetError where CP-SAT proved that no schedule with offload fits."""
        if result.status == "INFEASIBLE" and cap is not None:
            raise InternalError("the offload model refutes the incumbent's own cost")
        if result.status == "INFEASIBLE":
            budget = self.budget
            raise InfeasibleBudgetError(
                f"no schedule with offload fits a budget of {budget} bytes "
                f"({human_bytes(budget)}) over this link (proven in the stage space with "
                "offload, docs/offload.md); raise the budget",
                minimum_bytes=None,
                lower_bound_bytes=self.problem.one_line_floor,
            )

    def _nothing_found(self, no_model: str, bound: float) -> SolverTimeoutError:
        """The error where neither the heuristics nor the model found a schedule in time."""
        peaks = [run.peak for run in self.runs if run.valid]
        reached = (
            f"; the least peak the heuristics reach is {human_bytes(min(peaks))}" if peaks else ""
        )
        return SolverTimeoutError(
            f"no schedule within {human_bytes(self.budget)} was found in the time limit, with "
            f"offload or without ({no_model}{reached}); raise the time limit (--time-limit) "
            "or the budget",
            cost_bound=bound,
        )

    def _run_schedule(self, run: OffloadRun, status: str, bound: float | None) -> Schedule:
        """The schedule of a heuristic run (or the keep/recompute start), `found_by` it."""
        schedule = self._schedule(run.ops, status, bound)
        schedule.extra["found_by"] = run.param
        return schedule

    def _schedule(
        self, ops: Sequence[tuple[str, int]], status: str, bound: float | None
    ) -> Schedule:
        """The schedule of `ops`, replayed over the link: "OPTIMAL" with its own cost as the
        bound, else "FEASIBLE" with `bound` (at most its cost)."""
        budget = self.budget
        schedule = make_schedule(
            self.graph,
            self.problem,
            ops,
            method="exact",
            budget=budget,
            link=self.link,
            status="FEASIBLE",
        )
        if status == "OPTIMAL":
            schedule.status, schedule.bound = "OPTIMAL", schedule.cost
        else:
            schedule.bound = None if bound is None else min(bound, schedule.cost)
        if schedule.peak > budget:
            raise InternalError(
                f"the offload schedule peaks at {schedule.peak} bytes, over the budget of {budget}"
            )
        schedule.solve_seconds = time.perf_counter() - self.started
        return schedule


def _too_large(size: int, room: int, left: float, options: SolveOptions) -> str:
    """Why an offload model of more than `room` variables (`size`, counted up to
    `max_model_variables`) is not built with `left` seconds left."""
    if size > options.max_model_variables:
        return (
            f"the exact offload model would have more than {options.max_model_variables} "
            "variables (SolveOptions.max_model_variables; it grows as the square of the nodes): "
            "solve a smaller graph (graph_capture granularity='module', or a part of the model)"
        )
    return (
        f"the exact offload model would have more than {room} variables, too many for the "
        f"{left:.1f} s left (SolveOptions.model_variables_per_second = "
        f"{options.model_variables_per_second}); raise the time limit"
    )


def _from_start(
    graph: nx.DiGraph,
    problem: Problem,
    budget: int,
    link: Link,
    start: Schedule,
    deadline: Deadline,
) -> list[OffloadRun]:
    """The keep/recompute schedule `start` as a run without copies, and the offload heuristics
    (`solver.heuristics.offload`) from its plan."""
    plan = _stage_plan(problem, start.ops)
    ops = tuple((kind, problem.index[v]) for kind, v in start.ops)
    none = OffloadPlan(plan, (frozenset(),) * problem.n, frozenset())
    run = OffloadRun("keep/recompute", none, ops, True, start.peak, start.cost)
    return [run, *offload_runs(graph, problem, budget, link, {"keep/recompute": plan}, deadline)]


def _found(runs: list[OffloadRun], incumbent: OffloadRun | None) -> dict[str, object]:
    """What the offload heuristics found, for `extra["steps"]`: how many runs there are, and
    the incumbent's cost and who found it (None where no run fits)."""
    if incumbent is None:
        return {"runs": len(runs), "cost": None, "found_by": None}
    return {"runs": len(runs), "cost": incumbent.cost, "found_by": incumbent.param}


def _cheapest(runs: list[OffloadRun], budget: int) -> OffloadRun | None:
    """The cheapest run within `budget` bytes (ties: the lower peak), or None."""
    return min((r for r in runs if r.fits(budget)), key=lambda r: (r.cost, r.peak), default=None)


def _at_compute_cost(run: OffloadRun | None, problem: Problem) -> bool:
    """Whether `run` costs no more than computing every node once (the simulator's cost is the
    computes' sum plus the stall, so it has no stall and recomputes nothing that costs): every
    schedule computes each node at least once, so none costs less."""
    return run is not None and run.cost <= problem.total_cost


def _model_units(run: OffloadRun, times: OffloadTimes) -> int:
    """The least T of `run`'s plan in the model, or more: its simulated cost in the model's
    units (rounded up), plus a unit per op where the times were rounded."""
    units = run.cost * times.units.scale if times.units.scale else run.cost / times.units.unit
    return math.ceil(units - 1e-6) + (0 if times.exact else len(run.ops))


def _slack(schedule: Schedule) -> float:
    """How much cheaper than the incumbent CP-SAT's schedule must be to count as cheaper: a
    billionth of its cost (the simulator sums floats)."""
    return 1e-9 * max(1.0, abs(schedule.cost))


def offload_model_room(options: SolveOptions, seconds: float) -> int:
    """The most variables an offload model may have to be built and solved in `seconds`: as
    for the stage model (`solver.exact.stage_model`), `SolveOptions.model_variables_per_second`
    per second, at most `SolveOptions.max_model_variables` (building one takes about half of
    that time: 21,000 variables per second on `benchmarks.zoo.resnet50`'s module graph)."""
    return min(options.max_model_variables, int(options.model_variables_per_second * seconds))


def _check_accounting(schedule: Schedule, objective: int | None, times: OffloadTimes) -> None:
    """The simulator's cost of the model's plan is at most the model's objective (its least
    timeline; equal where CP-SAT proved it), to the rounding of the units."""
    assert objective is not None
    model = times.units.to_graph(objective)
    slack = 0.0 if times.exact else len(schedule.ops) * times.units.to_graph(1)
    tolerance = 1e-9 * max(1.0, abs(model)) + slack
    proven = schedule.status == "OPTIMAL"
    if schedule.cost > model + tolerance or (proven and schedule.cost < model - tolerance):
        raise InternalError(
            f"the offload model's timeline ({model:g}) disagrees with the simulator's "
            f"({schedule.cost:g})"
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
