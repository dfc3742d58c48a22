"""The state one exact search passes from step to step, and the invariants every step relies on.

NOTE [incumbent]: `Search.incumbent` is the best schedule known (a `Member`) and only ever
improves: `offer` replaces it only with a schedule that fits (peak <= budget, or cost <=
compute budget) and is strictly better (cost, then peak; for objective "memory" peak, then
cost). So every step may hand it whatever it finds, and the optimum is never lost.

NOTE [floor]: `Search.floor` is a proven lower bound on the objective (recompute cost in the
model's whole units, `solver.milp.units`; bytes for objective "memory") of every schedule in the
stage space that fits. It only ever rises, and never above the incumbent's value: a bound above
it would say that the incumbent does not exist, so it is read as "nothing strictly better"
(`raise_floor`). The search is closed (the incumbent optimal) when the floor meets the
incumbent.

NOTE [certificates]: what may raise the floor is a proof in whole cost units only, read the same
way whatever the unit the graph's costs are written in: a CP-SAT status or bound (integer
arithmetic, read exactly), an LP bound certified from its duals (`solver.milp.lp.safe_bound`),
or HiGHS's branch and cut (its verdicts at an integer cap, and its running bound through
`safe_floor`): `ModelResult.proven` and NOTE [safe bounds] in `solver.milp.units`. A proof over
the schedules within a cap c (a probe, a model built at a recompute limit c) says nothing about
those above it: `conclude` raises the floor to at most c + 1, and a refutation under a cap
equal to the incumbent's own value proves only that nothing is strictly better.

NOTE [threads]: an engine call may run on a second thread beside the pending warm starts
(`beside`), and both may offer schedules and raise the floor: `offer` and `raise_floor` compare
and assign under one lock, so the incumbent only improves and the floor only rises whichever
thread comes first.

NOTE [deadline]: `Search.deadline` is the only clock. Every step, heuristic and engine gets it
or a share of it (`share_of_limit`, `Deadline.share`) and the pipeline runs no step once it has
passed, so a solve returns by its time limit plus what one engine call overruns.

NOTE [checked]: every schedule `solver.solve` returns was replayed by the independent simulator
and its peak and cost checked against the budgets just before it is returned
(`solver.exact.pipeline.finish`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import networkx as nx

from solver.core.graph import Problem
from solver.core.stages import Member
from solver.deadline import Deadline
from solver.errors import InternalError
from solver.exact.options import SolveOptions
from solver.milp.cpsat import ProgressFn
from solver.milp.lp import DualBound
from solver.milp.model import LinearModel, ModelResult
from solver.milp.units import CostUnits

R = TypeVar("R")


@dataclass(frozen=True)
class Goal:
    """What the search minimises. objective "cost": the recompute cost (model units) among
    schedules of peak <= `budget` bytes (None: any); "memory": the peak (bytes) among schedules
    of cost <= `compute_budget` (graph units, None: any)."""

    objective: str
    units: CostUnits
    budget: int | None = None
    compute_budget: float | None = None

    def fits(self, member: Member) -> bool:
        """Whether the schedule meets the goal's budget."""
        if self.objective == "cost":
            return self.budget is None or member.schedule.peak <= self.budget
        limit = self.compute_budget
        return limit is None or member.schedule.cost <= limit * (1 + 1e-12)

    def value(self, member: Member) -> int:
        """The objective of a schedule: recompute cost in model units, or peak bytes."""
        if self.objective == "cost":
            return self.units.recompute(member.schedule)
        return member.schedule.peak

    def key(self, member: Member) -> tuple[float, float]:
        """Order of schedules: the objective, then the other quantity."""
        other = member.schedule.peak if self.objective == "cost" else member.schedule.cost
        return (self.value(member), other)

    def in_graph_units(self, value: float) -> float:
        """An objective value as the user reads it: cost in graph units, or bytes."""
        return self.units.graph_cost(value) if self.objective == "cost" else float(value)


@dataclass
class Search:
    """One solve in progress. The steps of `solver.exact.pipeline` read and update it; the notes
    above say what each field guarantees."""

    graph: nx.DiGraph
    problem: Problem
    goal: Goal
    options: SolveOptions
    workers: int
    deadline: Deadline
    time_limit: float
    started: float
    report: ProgressFn | None = None
    incumbent: Member | None = None
    floor: int = 0
    pending: dict[str, Callable[[], list[Member]]] = field(default_factory=dict)
    """Warm starts left to evaluate beside the next engine call (`beside`), by name, in the
    order they run (`defer`)."""
    first_tight: int = 0
    """The first stage over the budget in checkpoint-all (objective "cost")."""
    moments_ran: bool = False
    model: LinearModel | None = None
    model_limit: int | None = None
    """The recompute limit `model` was built at (None: none): it holds every schedule within."""
    lp: DualBound | None = None
    """The stage model's LP relaxation, its bound certified (`solver.milp.lp.solve_relaxation`)."""
    no_model: str = ""
    """Why the stage model was not built, for the message when nothing fits."""
    heuristic_peak: int | None = None
    """Where no heuristic fits the budget: the least peak (bytes) the heuristics reach, for the
    message when nothing fits (`warm_start`)."""
    lifetime_best: float | None = None
    """The cost (graph units) of the lifetime search's best plan so far (inf: it has run and
    found none yet; None: it has not run); the steps that run that search or the eviction
    search compare it with the incumbent."""
    trace: list[dict] = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    """What the running step found, added to its `trace` record."""
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    """Held while the incumbent or the floor is compared and changed (NOTE [threads])."""

    @property
    def units(self) -> CostUnits:
        return self.goal.units

    def elapsed(self) -> float:
        """Seconds since the solve began."""
        return time.perf_counter() - self.started

    def share_of_limit(self, fraction: float) -> Deadline:
        """The deadline `fraction` of the time limit after the start (or the solve's, if
        sooner), with the solve's stop (Ctrl-C)."""
        return self.deadline.until(self.started + fraction * self.time_limit)

    @property
    def value(self) -> int | None:
        """The incumbent's objective value (NOTE [incumbent]), None without one."""
        return None if self.incumbent is None else self.goal.value(self.incumbent)

    @property
    def closed(self) -> bool:
        """Whether the incumbent is proven optimal (NOTE [floor])."""
        return self.incumbent is not None and self.floor >= self.goal.value(self.incumbent)

    def offer(self, *members: Member | None) -> None:
        """Make the best of `members` that fits the incumbent if it beats it (NOTE
        [incumbent])."""
        for member in members:
            if member is None or not self.goal.fits(member):
                continue
            with self.lock:
                if self.incumbent is not None and not (
                    self.goal.key(member) < self.goal.key(self.incumbent)
                ):
                    continue
                if self.goal.value(member) < self.floor:
                    raise InternalError(
                        f"a schedule of value {self.goal.value(member)} under the proven floor "
                        f"{self.floor} ({member.param})"
                    )
                self.incumbent = member
                self.show()

    def raise_floor(self, bound: int) -> None:
        """Raise the floor to `bound` (whole units, or bytes), never above the incumbent (NOTE
        [floor])."""
        with self.lock:
            if self.incumbent is not None:
                bound = min(bound, self.goal.value(self.incumbent))
            if bound > self.floor:
                self.floor = bound
                self.show()

    def conclude(self, result: ModelResult, cap: int | None) -> None:
        """Raise the floor to what an engine's `result` proves on a model that holds every
        schedule of value <= cap (None: every schedule; NOTE [certificates]). An infeasible
        result with no cap is the caller's to report (`solver.exact.infeasible`)."""
        self.raise_floor(result.proven(cap))

    def note(self, **facts: object) -> None:
        """Record what the running step found (in the schedule's `extra["steps"]`)."""
        self.notes.update(facts)

    def show(self) -> None:
        """Report the incumbent and the floor to `report` (graph units, or bytes)."""
        if self.report is None:
            return
        shown = float("inf") if self.value is None else self.goal.in_graph_units(self.value)
        self.report(self.elapsed(), shown, self.goal.in_graph_units(self.floor))

    def engine_progress(self, relaxation: bool = False) -> ProgressFn | None:
        """`report` for an engine's progress callback (model units in, graph units out, seconds
        from the start of the solve). A relaxation's solutions are not schedules: with
        `relaxation` only its bound is shown, beside the incumbent."""
        report = self.report
        if report is None:
            return None
        goal = self.goal

        def forward(_: float, objective: float, bound: float) -> None:
            values = [] if relaxation else [objective]
            values += [] if self.value is None else [self.value]
            shown = goal.in_graph_units(min(values)) if values else float("inf")
            proven = goal.in_graph_units(max(bound, self.floor))
            report(self.elapsed(), shown, min(proven, shown))

        return forward

    def defer(
        self, name: str, work: Callable[[], list[Member]], *, before: Collection[str] = ()
    ) -> None:
        """Leave `work` to run beside the next engine call, ahead of the first pending work
        named in `before` (at the end where there is none)."""
        items = list(self.pending.items())
        at = next((i for i, (key, _) in enumerate(items) if key in before), len(items))
        items.insert(at, (name, work))
        self.pending = dict(items)

    def take_pending(self) -> list[Callable[[], list[Member]]]:
        """The warm starts left to evaluate, in order; none are left after this."""
        pending, self.pending = self.pending, {}
        return list(pending.values())

    def run_pending(self) -> None:
        """Evaluate the warm starts left (each honours its own deadline), offering each one's
        schedules as it finishes, so that the next starts from the best."""
        for work in self.take_pending():
            self.offer(*work())

    def beside(self, task: Callable[[], R]) -> R:
        """`task` (an engine call, which runs outside Python's lock) on a second thread while the
        pending warm starts run on this one (`run_pending`); then the task's result is returned.
        Both may offer schedules and raise the floor as they come (NOTE [threads])."""
        if not self.pending:
            return task()
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
            self.run_pending()
        finally:
            thread.join()
        if failure:
            raise failure[0]
        return result[0]


SearchStep = Callable[[Search], Search]
"""One step of the search: it takes the state and returns it (`solver.exact.pipeline`;
`SolveOptions.steps`)."""


def run_steps(search: Search, steps: Sequence[SearchStep]) -> Search:
    """Run `steps` in order until the search is closed or its deadline passes (NOTE
    [deadline]); each step's seconds and notes go to `search.trace`."""
    for step in steps:
        if search.closed or search.deadline.passed():
            break
        began, search.notes = search.elapsed(), {}
        search = step(search)
        seconds = round(search.elapsed() - began, 3)
        search.trace.append({"step": step.__name__, "seconds": seconds, **search.notes})
    return search
