"""A local search over eviction's choices: random keys on top of the eviction rule.

An eviction run (`solver.heuristics.eviction`) is fixed by its `EvictionKey`: the rule (the
exponent of the distance to the next read) and a priority factor per node that multiplies the
rule's score. The search starts from the rule's own runs (every factor 1, one run per
`DISTANCE_EXPONENTS`), or from a run it found before, and keeps the cheapest that fits; each
round multiplies the factors of a few nodes, drawn at random among the values a run can evict,
by log-normal noise, and keeps the new factors where the run fits and costs no more (ties move
across plateaus). Few nodes per round refine, many explore. Where the graph has repeated blocks
(`solver.core.repeats`), a node's factor changes with its mirrors' in every block (a choice
that pays in one copy of a layer tends to pay in all; on the 12-layer transformers of
`benchmarks.zoo` this reaches cheaper runs in the same time).

It is for tight budgets (near the least feasible peak), where the rule's choice of which values
a stage's rebuild starts from changes the cost by whole recomputed segments, the rule's four
runs are far apart, and the lifetime search, which repairs the peak stage one value at a time,
ends above them. `solver.exact.cascade` runs it after the lifetime search where that search
ends its starts behind the incumbent, and, where that search has gone quiet without being
behind, as the start of a last lifetime search (at per-block memory its best run is a start
the lifetime search's own do not reach); docs/solver.md has the rows it changed and the
command that measures them.

A seeded RNG keeps the search deterministic for a given number of rounds; every run honours the
deadline.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

from solver.core.graph import Problem
from solver.core.repeats import mirrors
from solver.core.stages import Member
from solver.deadline import Deadline
from solver.heuristics.eviction import evict_by_key, evict_within

NODES_CHANGED = (1, 3, 10, 30)
"""How many nodes' factors a round changes, drawn uniformly per round."""

NOISE = (0.3, 1.0)
"""Standard deviations of the log-normal noise on a changed factor, drawn uniformly per round."""


def eviction_search(
    problem: Problem,
    budget: int,
    *,
    deadline: Deadline,
    resume: Member | None = None,
    seed: int = 0,
    rounds: int | None = None,
    found: Callable[[Member], object] | None = None,
    stop: Callable[[], bool] | None = None,
    mirrored: bool = True,
) -> Member | None:
    """The cheapest eviction run within `budget` bytes found by `deadline` (or after `rounds`
    rounds, where given), from `resume` where it is an eviction run within the budget (it
    carries its `EvictionKey`), else from the rule's runs; None where none of those fits (the
    search needs a fitting start). `found` is called with each run cheaper than the start as
    it comes; `stop()` ends the search between rounds. `mirrored`: change each drawn node's
    factor with its mirrors' (where the graph has repeated blocks)."""
    if resume is not None and resume.eviction is not None and resume.schedule.peak <= budget:
        best: Member | None = resume
    else:
        best = evict_within(problem, budget, deadline)
    if best is None:
        return None
    key = best.eviction
    assert key is not None
    rng = random.Random(seed)
    factors = list(key.priorities or (1.0,) * problem.n)
    evictable = [v for v in range(problem.n) if problem.mem[v] > 0 and problem.succs[v]]
    groups = mirrors(problem) if mirrored else None
    done = 0
    while evictable and not deadline.passed() and not (stop is not None and stop()):
        if rounds is not None and done >= rounds:
            break
        done += 1
        changed = list(factors)
        sigma = rng.choice(NOISE)
        for v in rng.sample(evictable, min(len(evictable), rng.choice(NODES_CHANGED))):
            factor = math.exp(rng.gauss(0.0, sigma))
            for u in (groups.of(v) if groups else ()) or (v,):
                changed[u] *= factor
        changed_key = replace(key, priorities=tuple(changed))
        member = evict_by_key(problem, budget, changed_key, deadline, best.schedule.cost)
        if member is None or member.schedule.cost > best.schedule.cost:
            continue
        cheaper = member.schedule.cost < best.schedule.cost - 1e-12
        best, factors = member, changed
        if cheaper and found is not None:
            found(best)
    return best
