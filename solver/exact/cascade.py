"""Step: the cascade cover (`solver.milp.cascade`, `solver.milp.cascade_rounds`) and the
lifetime search (`solver.heuristics.lifetimes`) from its solution, where recomputes cascade
(op-level graphs); where the lifetime search does not reach the incumbent (tight budgets), the
eviction search (`solver.heuristics.eviction_search`) instead, and where it goes quiet, the
lifetime search again from the eviction search's best."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from solver.core.stages import Member
from solver.deadline import Deadline
from solver.exact.state import Search
from solver.exact.warm_start import moment_first, small_model
from solver.heuristics.eviction_search import EvictionMoves, eviction_search
from solver.heuristics.lifetimes import (
    LifetimeMoves,
    Lifetimes,
    lifetime_search,
    longest,
    start_from_away,
    start_from_member,
)
from solver.milp.cascade_rounds import CascadeBound, away_stages, cascade_bound
from solver.milp.cpsat import ProgressFn


def cascade_cover(search: Search) -> Search:
    """Step, for `TimeShares.cascade` of the time limit (less where the stage model is
    small, `_share`; the read-gap cover must have left the search open):

    1. the cascade cover's bound by row generation (its LP rounds until no row is broken, then
       a CP-SAT round with what is left of `TimeShares.cascade_first` of the limit, whose 0/1
       solution the lifetime search starts from); it raises the floor (NOTE [certificates]:
       a certified LP bound, or CP-SAT's);
    2. then, on two threads until the step's deadline: HiGHS's branch and cut raising the bound
       further (more rows, under the incumbent's cost as a cap; one thread) and, after
       per-block checkpointing and before the other warm starts (`Search.defer`), the lifetime
       search from checkpoint-all's lifetimes, the incumbent's and the relaxation's solution,
       each better plan offered as it comes (NOTE [incumbent]); once the bound is final, the
       search stops when it has not improved for `cascade_stall` of the limit, leaving the
       time to the next steps. Where, once every start is repaired and improved, its best
       plan is behind the incumbent by more than `eviction_behind` (at tight budgets an
       eviction run's plan, which the lifetime search's one-value-at-a-time repair does not
       reach), the eviction search (from the incumbent where that is an eviction run, else
       from the rule's runs) takes the rest of that time instead. Where, its starts done, the
       search is not behind but has not improved for `lifetime_quiet` of the limit, the
       eviction search and the lifetime search from its best (`_from_evictions`) take the
       rest of that time. At tight budgets (`_tight`) the eviction search runs in the lifetime
       search's place from the start.

    Skipped where no recompute in the cover's rows needs a dead input: the model is then the
    read-gap cover, which has run (the published training graphs). Where the moment relaxation
    runs next (`warm_start.moment_first`), only the first bound."""
    options = search.options
    if not options.cascade:
        return search
    problem, budget, units = search.problem, search.goal.budget, search.units
    assert budget is not None
    progress = search.engine_progress(relaxation=True)
    first = cascade_bound(
        problem,
        budget,
        units.int_cost,
        deadline=search.deadline.within(options.shares.cascade_first * search.time_limit),
        cap=_cap(search),
        cpsat_workers=search.workers,
        progress=progress,
    )
    if len(first.model.later) == 0:  # no dead input: the read-gap cover's model
        search.note(skipped="no dead inputs")
        return search
    search.raise_floor(first.bound)
    search.note(lp_bound=first.lp_bound, bound=first.bound, rows=len(first.model.rows))
    if search.closed or moment_first(search):
        # Where the moment relaxation runs next, it finds the plans (random_layered n=250 at
        # 90%: the optimum); the lifetime search would only delay it.
        return search
    run = _CascadeRun(search, first, progress)
    search.defer("lifetimes", run.search_lifetimes, before=("policies", "backward"))
    final = search.beside(run.raise_bound)
    search.raise_floor(final.bound)
    search.note(bound=final.bound, rows=len(final.model.rows))
    return search


class _CascadeRun:
    """The cascade step's second part (`cascade_cover`'s item 2): HiGHS raising the bound on one
    thread (`raise_bound`) while the lifetime and eviction searches look for plans on the other
    (`search_lifetimes`), until `deadline`. `last_change` (a `time.perf_counter()` reading) is
    when a better plan was last offered; `bound_done` is set once the bound is final."""

    def __init__(self, search: Search, first: CascadeBound, progress: ProgressFn | None) -> None:
        self.search = search
        self.options = search.options
        self.problem = search.problem
        budget = search.goal.budget
        assert budget is not None
        self.budget = budget
        self.deadline = search.share_of_limit(_share(search))
        self.away = None if first.values is None else away_stages(first.model, first.values)
        self.rows = first.model.rows
        self.progress = progress
        self.last_change = time.perf_counter()
        self.bound_done = threading.Event()

    def raise_bound(self) -> CascadeBound:
        try:
            return cascade_bound(
                self.problem,
                self.budget,
                self.search.units.int_cost,
                deadline=self.deadline,
                cap=_cap(self.search),
                progress=self.progress,
                rows=self.rows,
            )
        finally:
            self.bound_done.set()

    def found(self, member: Member) -> None:
        self.last_change = time.perf_counter()
        self.search.offer(member)

    def idle(self, share: float) -> bool:
        """No better plan for `share` of the limit."""
        return time.perf_counter() - self.last_change > share * self.search.time_limit

    def stalled(self) -> bool:
        """The bound is final and the search has not improved for `cascade_stall` of the
        limit: the steps after this one may close the gap (the moment relaxation, probes)."""
        return self.bound_done.is_set() and self.idle(self.options.cascade_stall)

    def found_lifetimes(self, member: Member) -> None:
        assert self.search.lifetime_best is not None  # set before the search starts
        self.search.lifetime_best = min(self.search.lifetime_best, member.schedule.cost)
        self.found(member)

    def done(self) -> bool:
        """Stalled, or the incumbent proven optimal: nothing is left to search for."""
        return self.stalled() or self.search.closed

    def search_evictions(self) -> None:
        """The eviction search from the incumbent (where that is an eviction run, else from the
        rule's runs) for the rest of the step, each better run offered as it comes."""
        eviction_search(
            self.problem,
            self.budget,
            deadline=self.deadline,
            resume=self.search.incumbent,
            found=self.found,
            stop=self.done,
            moves=EvictionMoves(mirrored=self.options.mirror_moves),
        )

    def search_lifetimes(self) -> list[Member]:
        """Where the budget is tight (`_tight`), the eviction search instead, for the whole
        time. Elsewhere the lifetime search from checkpoint-all (on the 12-layer transformers of
        `benchmarks.zoo` the best of the three), the incumbent when it starts (per-block
        checkpointing runs first) and the relaxation's solution; then, where that search is
        behind, the eviction search; where it is not behind but has gone quiet, the eviction
        search and the lifetime search from its best (`_from_evictions`)."""
        search = self.search
        if _tight(search):
            self.search_evictions()
            return []
        if search.lifetime_best is None:
            search.lifetime_best = math.inf
        lifetime_search(
            self.problem,
            self.budget,
            self._starts(),
            deadline=self.deadline,
            found=self.found_lifetimes,
            enough=lambda member: search.goal.value(member) <= search.floor,
            stop=self._lifetimes_stop,
            moves=LifetimeMoves(mirrored=self.options.mirror_moves),
        )
        if self.done() or self.deadline.passed():
            return []
        if _lifetimes_behind(search):
            self.search_evictions()
        else:
            _from_evictions(search, self.deadline, self.found, self.found_lifetimes, self.done)
        return []  # each better plan was offered as it came

    def _starts(self) -> list[Lifetimes]:
        """The lifetime search's starts: checkpoint-all's lifetimes, the incumbent's, the
        relaxation's solution (the last two where there is one)."""
        starts = [longest(self.problem)]
        if self.search.incumbent is not None:
            starts.append(start_from_member(self.problem, self.search.incumbent))
        if self.away is not None:
            starts.append(start_from_away(self.problem, *self.away))
        return starts

    def _lifetimes_stop(self) -> bool:
        return (
            self.stalled()
            or _lifetimes_behind(self.search)
            or self.idle(self.options.lifetime_quiet)
        )


def _from_evictions(
    search: Search,
    deadline: Deadline,
    found_run: Callable[[Member], object],
    found_plan: Callable[[Member], object],
    stop: Callable[[], bool],
) -> None:
    """The eviction search from the rule's runs for half the time to `deadline` (each better
    run given to `found_run`), then the lifetime search from its best until then (each better
    plan given to `found_plan`): a start the lifetime search's own do not reach (at per-block
    checkpoint's memory on BERT-12 and GPT-2-12 it ends cheaper than the search from
    checkpoint-all)."""
    problem, budget, options = search.problem, search.goal.budget, search.options
    assert budget is not None
    best = eviction_search(
        problem,
        budget,
        deadline=deadline.share(options.shares.cascade_eviction),
        found=found_run,
        stop=stop,
        moves=EvictionMoves(seed=2, mirrored=options.mirror_moves),
    )
    if best is not None:
        lifetime_search(
            problem,
            budget,
            [start_from_member(problem, best)],
            deadline=deadline,
            found=found_plan,
            stop=stop,
            moves=LifetimeMoves(seed=2, mirrored=options.mirror_moves),
        )


def _tight(search: Search) -> bool:
    """The incumbent recomputes at least `eviction_first` of the cost of computing every node
    once. There the lifetime search's repairs of its starts take the cascade step's time
    without reaching an eviction run (BERT-12 at 8% of the checkpoint-all peak: 44 s with the
    incumbent unchanged at 1.17 of the node costs recomputed), and the eviction search is what
    improves the schedule."""
    incumbent, floor = search.incumbent, search.problem.total_cost
    if incumbent is None:
        return False
    return incumbent.schedule.cost - floor >= search.options.eviction_first * floor


def _lifetimes_behind(search: Search) -> bool:
    """The lifetime search's best plan recomputes more than the incumbent's recomputation by
    more than `eviction_behind` of it (or it has run and found none). False where it has not
    run (the cascade step skipped: the published graphs)."""
    incumbent, floor = search.incumbent, search.problem.total_cost
    if incumbent is None or search.lifetime_best is None:
        return False
    ahead = (1 + search.options.eviction_behind) * (incumbent.schedule.cost - floor)
    return search.lifetime_best - floor > ahead + 1e-12


def _share(search: Search) -> float:
    """The step's share of the limit: `TimeShares.cascade`, or `cascade_small` where the stage
    model is small enough for the steps after it (the moment relaxation, the stage model's
    probes) to search it (`warm_start.small_model`)."""
    options = search.options
    return options.shares.cascade_small if small_model(search) else options.shares.cascade


def _cap(search: Search) -> int | None:
    """Costs above the incumbent's need no bound: the cap for the relaxation's search."""
    return None if search.value is None else search.value - 1


def lifetime_polish(search: Search) -> Search:
    """Step, last: while the search is open and time is left, the lifetime search from the
    incumbent's plan until the deadline (each better plan offered as it comes), so that the
    whole limit is used; where the budget is tight (`_tight`), or the incumbent is an eviction
    run and the lifetime search is behind it (`_lifetimes_behind`), the eviction search instead
    (from the incumbent where that is an eviction run, else from the rule's runs)."""
    if not search.options.cascade or search.incumbent is None:
        return search
    problem, budget = search.problem, search.goal.budget
    assert budget is not None
    if _tight(search) or (search.incumbent.eviction is not None and _lifetimes_behind(search)):
        eviction_search(
            problem,
            budget,
            deadline=search.deadline,
            resume=search.incumbent,
            found=search.offer,
            moves=EvictionMoves(seed=1, mirrored=search.options.mirror_moves),
        )
        return search
    lifetime_search(
        problem,
        budget,
        [start_from_member(problem, search.incumbent)],
        deadline=search.deadline,
        found=search.offer,
        moves=LifetimeMoves(seed=1, mirrored=search.options.mirror_moves),
        enough=lambda member: search.goal.value(member) <= search.floor,
    )
    return search
