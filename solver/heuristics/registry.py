"""Every heuristic family the solver knows for a graph: the baselines, plus rotor on chains.

The exact solver warm-starts from their best member (and from the heuristics run at its budget,
`solver.warm_start`), and the frontier and benchmarks compare against them, so all three read the
same list.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection

from solver.core.graph import Problem
from solver.heuristics.baselines import (
    BASELINES,
    Member,
    cheapest_within,
    every_k_recompute_each_use,
)
from solver.heuristics.rotor import NotAChainError, rotor

ROTOR_MAX_FORWARD = 80
"""Longest chain (forward nodes) rotor runs on: its program is O(n^3) array operations over the
memory grid, about a minute at 150 forward nodes on a 2-core machine."""

_EACH_USE = "every_k_recompute_each_use"


def families(problem: Problem, skip: Collection[str] = ()) -> dict[str, list[Member]]:
    """Every family of `solver.BASELINES` by name (less those in `skip`), plus "rotor" when the
    graph is the training graph of a chain of at most ROTOR_MAX_FORWARD forward nodes."""
    out = {name: make(problem) for name, make in BASELINES.items() if name not in skip}
    if sum(not b for b in problem.backward) <= ROTOR_MAX_FORWARD:
        with contextlib.suppress(NotAChainError):
            out["rotor"] = rotor(problem)
    return out


def all_members(problem: Problem, skip: Collection[str] = ()) -> list[Member]:
    """Every member of every family (less those in `skip`): the candidates for a warm start."""
    return [member for members in families(problem, skip).values() for member in members]


def cheapest_policy(problem: Problem, budget: int, fallback: bool = True) -> Member | None:
    """The cheapest member of every family within `budget` bytes (the exact solver's warm start
    beside `solver.warm_start`'s heuristics). The recompute-at-each-use family costs most to
    evaluate (O(n^2) ops per member: 0.7 s on ResNet50, 6 s on random_layered n=250) and its
    members cost several times any other fitting schedule (4.7x on ResNet50 at 90%, 84x on
    random_layered n=250 at 90%), so it is evaluated only when nothing else fits: no other
    family, and with fallback=False a schedule the caller already has."""
    best = cheapest_within(all_members(problem, skip=(_EACH_USE,)), budget)
    if best is not None or not fallback:
        return best
    return cheapest_within(every_k_recompute_each_use(problem), budget)
