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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import networkx as nx

from solver.core.budget import human_bytes
from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import offload_ops
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import plan_from_keep, plan_to_ops
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, InternalError, RematError, SolverTimeoutError
from solver.exact.offload.model_step import (
    check_accounting,
    check_feasible,
    in_graph_units,
    model_units,
    nothing_found,
    offload_model_room,
    slack,
    too_large,
)
from solver.exact.offload.runs import at_compute_cost, cheapest, found_facts, from_start
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
        if at_compute_cost(self.incumbent, problem):
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
                from_start(
                    self.graph,
                    problem,
                    budget,
                    self.link,
                    start,
                    deadline.share(shares.offload_heuristics),
                ),
            )
        if at_compute_cost(self.incumbent, problem):
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
        self.incumbent = cheapest(self.runs, self.budget)
        self.steps.done(f"offload heuristics from {base}", **found_facts(self.runs, self.incumbent))

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
        cap = None if incumbent is None else model_units(incumbent, times)
        left = self.deadline.remaining()
        room = offload_model_room(self.options, left)
        tried = size <= room
        if not tried:
            result = OffloadResult("UNKNOWN", None, None, 0)
            no_model = (
                "interrupted before the exact offload model was built"
                if self.deadline.stopped()
                else too_large(size, room, left, self.options)
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
                progress=None if self.progress is None else in_graph_units(self.progress, times),
            )
            no_model = "the exact offload model was not solved in the time left"
            self.steps.done("offload model", variables=size, built=True, status=result.status)
        check_feasible(result, cap, budget, problem.one_line_floor)
        # every node is computed at least once: the bound where CP-SAT proved nothing more
        bound = max(times.units.to_graph(result.bound), problem.total_cost)
        found = None
        if result.plan is not None:
            ops = offload_ops(problem, result.plan)
            found = self._schedule(ops, result.status, bound)
            check_accounting(found, result.objective, times)
        if found is not None and (incumbent is None or found.cost < incumbent.cost - slack(found)):
            return found
        if incumbent is None:
            raise nothing_found(self.runs, budget, no_model, bound)
        # CP-SAT's proof holds for the incumbent too: it costs no more than CP-SAT's optimum
        status = "OPTIMAL" if result.status == "OPTIMAL" else "FEASIBLE"
        schedule = self._run_schedule(incumbent, status, bound)
        if not tried:
            schedule.extra["offload_model"] = no_model
        return schedule

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
