"""The least-peak search: the heuristic schedule of least peak within a compute budget, found by
bisecting the byte budget over the heuristics that run at one (eviction, backward search).

It is the warm start of the exact solver's objective "memory" (`solver.exact.least_peak`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from solver.core.graph import Problem
from solver.core.stages import Member, cheapest_within, checkpoint_all
from solver.deadline import NEVER, Deadline
from solver.heuristics.backward import backward_runs
from solver.heuristics.eviction import eviction_runs


def least_peak(
    problem: Problem,
    compute_budget: float | None = None,
    deadline: Deadline = NEVER,
    found: Callable[[Member], object] | None = None,
) -> Member | None:
    """The heuristic run of least peak among runs whose cost is within `compute_budget` (None:
    any), or None when none qualifies: an eviction run at the peak floor when it fits (VGG),
    else eviction runs counting direct reads bisecting the byte budget between that bound and
    the checkpoint-all peak (to a thousandth of that peak), then, below the best of those, runs
    counting recomputations' reads (`EvictionKey.recompute_reads`), then backward searches. The
    fastest go first (a run counting recomputations' reads takes 2-3x as long, a probe of a
    backward search that finds nothing explores its whole state limit). Every run honours
    `deadline`, and the bisection stops there; `found` is called with each run of a new least
    peak as it comes. A run that fits a budget need not fit every larger one, so this is a
    heuristic search: it keeps the best run it saw."""
    low, high = problem.memory_lower_bound, checkpoint_all(problem).peak

    def within(runs: list[Member], budget: int) -> Member | None:
        if compute_budget is not None:
            runs = [run for run in runs if run.schedule.cost <= compute_budget * (1 + 1e-12)]
        member = cheapest_within(runs, budget)
        if member is not None and found is not None:
            found(member)
        return member

    def evicted(recompute_reads: bool) -> Callable[[int], Member | None]:
        kinds = (recompute_reads,)
        return lambda budget: within(eviction_runs(problem, budget, deadline, kinds), budget)

    def backward(budget: int) -> Member | None:
        return within(backward_runs(problem, budget, deadline), budget)

    best = evicted(False)(low)
    if best is not None:  # nothing peaks lower than the peak floor
        return best
    for fitting in (evicted(False), evicted(True), backward):
        top = high if best is None else best.schedule.peak
        best = _bisect(fitting, low, top, deadline) or best
    return best


def _bisect(
    fitting: Callable[[int], Member | None], low: int, high: int, deadline: Deadline
) -> Member | None:
    """The member of least peak `fitting` gave while bisecting budgets between low (assumed not
    to fit) and high bytes, to a thousandth of high; None when none fitted. The middle is the
    geometric one (bytes): where the least peak is a small share of the checkpoint-all peak (3%
    on a 24-layer Llama), each probe halves the ratio's logarithm, so a search cut short by its
    deadline is still near it, where the arithmetic middle spends the first probes far above."""
    best = None
    while high - low > max(1, high // 1000):
        if deadline.passed():
            break
        middle = min(high - 1, max(low + 1, math.isqrt(max(low, 1) * high)))
        member = fitting(middle)
        if member is not None:
            best, high = member, min(middle, member.schedule.peak)
        else:
            low = middle
    return best
