"""The one registry of heuristics: every schedule family the solver knows, by name.

Two kinds, one signature (`Heuristic.runs(problem, budget, deadline) -> list[Member]`):

- checkpoint policies (`solver.heuristics.baselines.BASELINES`, and rotor on the training graphs
  of short chains): families chosen without looking at the budget; a budget picks their cheapest
  member that fits;
- heuristics run at a byte budget (eviction, the backward search): they spend the budget, and
  have no members without one.

The exact solver's warm starts (`solver.exact.warm_start`), the `remat solve` table, the
frontier and the benchmarks all read `HEURISTICS`; adding a heuristic is one entry here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import networkx as nx

from solver.core.budget import parse_budget
from solver.core.graph import Problem, prepare
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import Member, cheapest_within
from solver.deadline import NEVER, Deadline, check_time_limit
from solver.errors import ArgumentError, BudgetError
from solver.heuristics.backward import backward_runs
from solver.heuristics.baselines import BASELINES, Family, every_k_recompute_each_use
from solver.heuristics.eviction import eviction_runs
from solver.heuristics.rotor import NotAChainError, chain_shape, rotor
from solver.spelling import spelled

Runs = Callable[[Problem, int | None, Deadline], list[Member]]
"""A heuristic's schedules on a problem at a byte budget (None: none given), by a deadline."""

ROTOR_MAX_FORWARD = 80
"""Longest chain (forward nodes) rotor runs on: its program is O(n^3) array operations over the
memory grid (seconds at this length, a minute at twice it)."""

EACH_USE = "every_k_recompute_each_use"
"""The policy family that costs most to evaluate (O(n^2) ops per member) and whose members cost
several times any other fitting schedule: warm starts evaluate it only when nothing else fits."""


@dataclass(frozen=True)
class Heuristic:
    """A named heuristic. `at_budget`: it runs at a byte budget (no members without one);
    `applies`: whether it has anything to say about a problem at all (rotor: chains only)."""

    name: str
    runs: Runs
    at_budget: bool = False
    applies: Callable[[Problem], bool] = lambda problem: True


def _policy(family: Family) -> Runs:
    return lambda problem, budget, deadline: family(problem, deadline)


def _budgeted(runs: Callable[[Problem, int, Deadline], list[Member]]) -> Runs:
    return lambda problem, budget, deadline: (
        [] if budget is None else runs(problem, budget, deadline)
    )


def _is_short_chain(problem: Problem) -> bool:
    if sum(not b for b in problem.backward) > ROTOR_MAX_FORWARD:
        return False
    try:
        chain_shape(problem)
    except NotAChainError:
        return False
    return True


def _rotor(problem: Problem, budget: int | None, deadline: Deadline) -> list[Member]:
    try:
        return rotor(problem, deadline)
    except NotAChainError:  # a chain whose schedules would leave a node uncomputed
        return []


HEURISTICS: dict[str, Heuristic] = {
    **{name: Heuristic(name, _policy(family)) for name, family in BASELINES.items()},
    "rotor": Heuristic("rotor", _rotor, applies=_is_short_chain),
    "eviction": Heuristic("eviction", _budgeted(eviction_runs), at_budget=True),
    "backward": Heuristic("backward", _budgeted(backward_runs), at_budget=True),
}
"""Every heuristic by the name tables, the CLI and `solver.baseline` give it."""


def members(
    problem: Problem,
    budget: int | None = None,
    names: Collection[str] | None = None,
    deadline: Deadline = NEVER,
) -> dict[str, list[Member]]:
    """The schedules of each heuristic in `names` (default: all) that applies to `problem` and,
    for those run at a budget, has one; each stops at `deadline`, and none starts when twice the
    slowest schedule made so far would not end before it."""
    chosen = HEURISTICS.values() if names is None else [HEURISTICS[name] for name in names]
    found: dict[str, list[Member]] = {}
    slowest = 0.0  # seconds per schedule, the most any heuristic took so far
    for h in chosen:
        if h.applies(problem) and (budget is not None or not h.at_budget):
            began = time.perf_counter()
            if not deadline.leaves(2 * slowest):
                found[h.name] = []
                continue
            found[h.name] = h.runs(problem, budget, deadline)
            per_member = (time.perf_counter() - began) / max(1, len(found[h.name]))
            slowest = max(slowest, per_member)
    return found


def all_policies(
    problem: Problem,
    deadline: Deadline = NEVER,
    each_use: bool = False,
    names: Collection[str] | None = None,
) -> list[Member]:
    """Every member of every checkpoint policy (rotor included where it applies, EACH_USE only
    with `each_use`), or of those in `names`: the candidates of a warm start that ignores the
    budget."""
    chosen = [
        h.name
        for h in HEURISTICS.values()
        if not h.at_budget
        and (each_use or h.name != EACH_USE)
        and (names is None or h.name in names)
    ]
    return [m for family in members(problem, None, chosen, deadline).values() for m in family]


def cheapest_policy(
    problem: Problem,
    budget: int,
    fallback: bool = True,
    deadline: Deadline = NEVER,
    names: Collection[str] | None = None,
) -> Member | None:
    """The cheapest checkpoint-policy member (of the policies in `names`, default all) within
    `budget` bytes; EACH_USE is evaluated only when nothing else fits and `fallback` (the caller
    has no schedule of its own)."""
    best = cheapest_within(all_policies(problem, deadline, names=names), budget)
    if best is not None or not fallback:
        return best
    return cheapest_within(every_k_recompute_each_use(problem, deadline), budget)


@spelled
def baseline(
    graph: nx.DiGraph,
    name: str,
    budget: int | str | None = None,
    *,
    time_limit: float | None = None,
) -> Schedule | None:
    """Run one heuristic of `HEURISTICS` on `graph` for at most `time_limit` seconds (None: to
    its end): its cheapest schedule within `budget` (bytes, or text like "80%" of the
    checkpoint-all peak; None: any), or None when none fits. ArgumentError for an unknown
    heuristic or a `time_limit` that is not a positive number of seconds."""
    deadline = _deadline(time_limit)
    if name not in HEURISTICS:
        raise ArgumentError(f"unknown heuristic {name!r}; choose from {', '.join(HEURISTICS)}")
    problem = prepare(graph)
    limit = None if budget is None else parse_budget(budget, problem)
    if HEURISTICS[name].at_budget and limit is None:
        raise BudgetError(f"{name} runs at a memory budget: give one")
    found = members(problem, limit, [name], deadline).get(name, [])
    best = cheapest_within(found, limit)
    if best is None:
        return None
    return make_schedule(
        graph, problem, best.schedule, method=name, budget=limit, extra={"param": best.param}
    )


@spelled
def evict(
    graph: nx.DiGraph, budget: int | str, *, time_limit: float | None = None
) -> Schedule | None:
    """The eviction heuristic on `graph` within `budget` (bytes, or text like "80%" of the
    checkpoint-all peak) for at most `time_limit` seconds (None: to its end): its schedule, or
    None where every run gets stuck."""
    return baseline(graph, "eviction", budget, time_limit=time_limit)


def _deadline(time_limit: float | None) -> Deadline:
    """`time_limit` seconds from now (None: never); ArgumentError where it is not a positive
    number of seconds."""
    if time_limit is None:
        return NEVER
    check_time_limit(time_limit)
    return Deadline.after(time_limit)
