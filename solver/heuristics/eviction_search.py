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
the lifetime search's own do not reach); docs/heuristics.md has the rows it changed and the
command that measures them.

Random rounds alternate with **pin** rounds while there are pins to try. A pin sets one value's
factor to `PINNED`, so the run keeps it while anything else can go; the pins are tried on a
second line of the search from the same start, each kept only where the run is cheaper, the
first `pin_tries` candidates of each cheaper run (`pin_candidates`). When none is left and that
line holds the cheapest run, the random rounds go on from it. Noise cannot do what a pin does
where the rule's scores are orders of magnitude apart: on GPT-2 (tied embeddings) at tight
budgets the final layer norm's output is read again only by the head's weight gradient at the
end of the backward, the rule evicts it first, and the last stage rebuilds the whole forward;
pinning it takes the rule's best run on `benchmarks.zoo` GPT-2-12 at 7% of the checkpoint-all
peak from 1.22 to 0.90 of the node costs recomputed. The random rounds are not run from the
pinned line from the start: on BERT-12 at 7% they reach 0.84 in 8 s from the rule's run, and
0.93 in 15 s from the pins'.

A seeded RNG keeps the search deterministic for a given number of rounds; every run honours the
deadline.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from solver.core.graph import Problem
from solver.core.repeats import Mirrors, mirrors
from solver.core.stages import Member, StagePlan
from solver.deadline import Deadline
from solver.heuristics.eviction import evict_by_key, evict_within

NODES_CHANGED = (1, 3, 10, 30)
"""How many nodes' factors a round changes, drawn uniformly per round."""

NOISE = (0.3, 1.0)
"""Standard deviations of the log-normal noise on a changed factor, drawn uniformly per round."""

PINNED = 1e-9
"""The factor of a pinned value (`pin_candidates`): its score falls far below the others', so a
run evicts it last."""

PIN_TRIES = 8
"""How many pin candidates of each cheaper run on its pinned line `eviction_search` tries by
default."""


def pin_candidates(problem: Problem, plan: StagePlan) -> list[int]:
    """The values `plan` recomputes, most recomputation per byte first: where a stage
    recomputes u, u's share is its cost plus the shares of its inputs recomputed in that stage
    (shared ancestors count once per path), summed over the stages that recompute u and
    divided by u's bytes. Keeping u live would have saved (up to the over-count) that much
    recomputation for its bytes; the top of a long rebuild ranks first. Values of 0 bytes are
    left out (keeping them costs nothing, so the rule never evicts them for want of room)."""
    saved = [0.0] * problem.n
    for stage in plan.computed:
        share: dict[int, float] = {}
        for u in stage[:-1]:  # ascending, topological; the last one is the stage's own node
            share[u] = problem.cost[u] + sum(share.get(q, 0.0) for q in problem.preds[u])
            saved[u] += share[u]
    ranked = [u for u in range(problem.n) if saved[u] > 0 and problem.mem[u] > 0]
    return sorted(ranked, key=lambda u: (-saved[u] / problem.mem[u], u))


@dataclass(frozen=True)
class EvictionMoves:
    """How `eviction_search` draws its moves: `seed` of its random draws; `mirrored`: change
    each drawn node's factor with its mirrors' (where the graph has repeated blocks);
    `pin_tries`: how many of the pin candidates of each cheaper run on the pinned line to try
    (0: random rounds only)."""

    seed: int = 0
    mirrored: bool = True
    pin_tries: int = PIN_TRIES


def eviction_search(
    problem: Problem,
    budget: int,
    *,
    deadline: Deadline,
    resume: Member | None = None,
    rounds: int | None = None,
    found: Callable[[Member], object] | None = None,
    stop: Callable[[], bool] | None = None,
    moves: EvictionMoves = EvictionMoves(),
) -> Member | None:
    """The cheapest eviction run within `budget` bytes found by `deadline` (or after `rounds`
    rounds, where given), from `resume` where it is an eviction run within the budget (it
    carries its `EvictionKey`), else from the rule's runs; None where none of those fits (the
    search needs a fitting start), drawing its moves as `moves` says. `found` is called with
    each run cheaper than the start as it comes; `stop()` ends the search between rounds."""
    if resume is not None and resume.eviction is not None and resume.schedule.peak <= budget:
        start: Member | None = resume
    else:
        start = evict_within(problem, budget, deadline)
    if start is None:
        return None
    evictable = _evictable(problem)
    groups = mirrors(problem) if moves.mirrored else None
    rng = random.Random(moves.seed)
    randomly = _Chain(problem, start, 0)
    pinning = _Chain(problem, start, moves.pin_tries)
    best = start
    done = 0
    while evictable and not deadline.passed() and not (stop is not None and stop()):
        if rounds is not None and done >= rounds:
            break
        pinned = bool(pinning.pins) and done % 2 == 1
        chain = pinning if pinned else randomly
        done += 1
        if pinned:
            changed = list(chain.factors)
            changed[pinning.pins.pop(0)] = PINNED
        else:
            changed = _perturbed(chain.factors, evictable, groups, rng)
        key = replace(chain.best.eviction, priorities=tuple(changed))
        member = evict_by_key(problem, budget, key, deadline, chain.best.schedule.cost)
        if member is not None and member.schedule.cost <= chain.best.schedule.cost:
            cheaper = member.schedule.cost < chain.best.schedule.cost - 1e-12
            if cheaper or not pinned:  # a pin that saves nothing only narrows the choices
                chain.move(problem, member, changed, cheaper)
            if member.schedule.cost < best.schedule.cost - 1e-12:
                best = member
                if found is not None:
                    found(best)
        if pinned and not pinning.pins and best is pinning.best:
            randomly.move(problem, pinning.best, pinning.factors, True)  # go on from the pins
    return best


def peak_search(
    problem: Problem,
    start: Member,
    *,
    deadline: Deadline,
    cost_cap: float | None = None,
    enough: int | None = None,
    seed: int = 0,
    found: Callable[[Member], object] | None = None,
) -> Member:
    """The eviction run of least peak found by `deadline`, from `start` (an eviction run): each
    round perturbs the best run's factors as `eviction_search`'s random rounds do and runs them
    at a budget a thousandth of a peak below the best run's peak, keeping the run where it fits
    and costs at most `cost_cap` (graph units, where given); `found` is called with each run
    kept. It stops once the best run peaks at or under `enough` bytes, where given. For
    objective "memory" once the least-peak search has bisected its budgets: on
    `benchmarks.zoo` GPT-2-12 it took the least peak 3% lower in about a second, on GPT-2-4 1%,
    on BERT-12 nothing in 20 s."""
    assert start.eviction is not None
    evictable = _evictable(problem)
    groups = mirrors(problem)
    rng = random.Random(seed)
    best, factors = start, list(start.eviction.priorities or (1.0,) * problem.n)
    while evictable and not deadline.passed():
        if enough is not None and best.schedule.peak <= enough:
            break
        changed = _perturbed(factors, evictable, groups, rng)
        key = replace(best.eviction, priorities=tuple(changed))
        lower = best.schedule.peak - max(1, best.schedule.peak // 1000)
        member = evict_by_key(problem, lower, key, deadline, cost_cap)
        if member is not None:
            best, factors = member, changed
            if found is not None:
                found(best)
    return best


def _evictable(problem: Problem) -> list[int]:
    """The values a run can evict: those of nonzero bytes that some node reads."""
    return [v for v in range(problem.n) if problem.mem[v] > 0 and problem.succs[v]]


def _perturbed(
    factors: list[float], evictable: list[int], groups: Mirrors | None, rng: random.Random
) -> list[float]:
    """`factors` with those of 1-30 values drawn from `evictable` (`NODES_CHANGED`) multiplied
    by log-normal noise (`NOISE`), each with its mirrors' where `groups` is given."""
    changed = list(factors)
    sigma = rng.choice(NOISE)
    for v in rng.sample(evictable, min(len(evictable), rng.choice(NODES_CHANGED))):
        factor = math.exp(rng.gauss(0.0, sigma))
        for u in (groups.of(v) if groups else ()) or (v,):
            changed[u] *= factor
    return changed


class _Chain:
    """One line of the search: its best run, that run's factors and the pin candidates it has
    still to try (`tries` of them after each cheaper run; 0: none)."""

    def __init__(self, problem: Problem, start: Member, tries: int) -> None:
        assert start.eviction is not None
        self.tries = tries
        self.best = start
        self.factors = list(start.eviction.priorities or (1.0,) * problem.n)
        self.pins = _untried_pins(problem, start.plan, self.factors, tries)

    def move(self, problem: Problem, member: Member, factors: list[float], cheaper: bool) -> None:
        """Continue from `member`, run with `factors`; new pins to try where it is `cheaper`."""
        self.best, self.factors = member, factors
        if cheaper:
            self.pins = _untried_pins(problem, member.plan, factors, self.tries)


def _untried_pins(problem: Problem, plan: StagePlan, factors: list[float], tries: int) -> list[int]:
    """The first `tries` of `plan`'s pin candidates not pinned already (none ranked where
    `tries` is 0: the random line calls this on each cheaper run)."""
    if tries <= 0:
        return []
    return [u for u in pin_candidates(problem, plan) if factors[u] != PINNED][:tries]
