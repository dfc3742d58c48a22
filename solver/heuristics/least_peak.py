"""Warm starts: the heuristics that run at a byte budget (eviction forward, backward search), by
name, and the least-peak search over them.

Neither heuristic is best everywhere (cost over computing every node once, eviction / backward
search, measured: random_layered n=500 at 90% of the checkpoint-all peak 1.069 / 1.008, n=1000
1.467 / 1.018, n=250 at 80% none / 1.057; FCN8 at 80% 1.0014 / 1.016; demo resnet at 50% 1.066
/ 1.300): the exact solver evaluates both (`solver.exact`), the least-peak search bisects over both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from solver.core.graph import Problem
from solver.core.stages import checkpoint_all
from solver.heuristics.backward import backward_runs
from solver.heuristics.baselines import Member, cheapest_within
from solver.heuristics.eviction import eviction_runs

BUDGETED: dict[str, Callable[[Problem, int], list[Member]]] = {
    "eviction": eviction_runs,
    "backward": backward_runs,
}
"""The heuristics that run at a byte budget (unlike the checkpoint policies of
`solver.BASELINES`, which ignore it), by the name the tables and the CLI give them."""


def least_peak(
    problem: Problem, compute_budget: float | None = None, deadline: float | None = None
) -> Member | None:
    """The heuristic run of least peak among runs whose cost is within `compute_budget` (None:
    any), or None when none qualifies: an eviction run at the one-line bound when it fits (VGG),
    else eviction runs bisecting the byte budget between that bound and the checkpoint-all peak
    (to a thousandth of that peak), then backward searches bisecting below the best of those.
    Eviction goes first because it is fast (a probe takes milliseconds, where a backward search
    that finds nothing takes 1-4 s). Stops early when `time.perf_counter()` passes `deadline`.
    A run that fits a budget need not fit every larger one, so this is a heuristic search: it
    keeps the best run it saw. Measured (share of the checkpoint-all peak, eviction / backward,
    no deadline): random_layered n=250 86% / 74.5% (15.6 s), n=500 - / 72.9%; demo gpt 18.4% /
    none lower (the backward bisection spent 40 s failing); demo resnet 32.7% / none lower; the
    best policy on the demo graphs reaches 22.3% (gpt) and 37.2% (resnet)."""
    low, high = problem.memory_lower_bound, checkpoint_all(problem).peak

    def within(runs: list[Member], budget: int) -> Member | None:
        if compute_budget is not None:
            runs = [run for run in runs if run.schedule.cost <= compute_budget * (1 + 1e-12)]
        return cheapest_within(runs, budget)

    def evicted(budget: int) -> Member | None:
        return within(eviction_runs(problem, budget), budget)

    def backward(budget: int) -> Member | None:
        return within(backward_runs(problem, budget, deadline), budget)

    best = evicted(low)
    if best is not None:  # nothing peaks lower than the one-line bound
        return best
    best = _bisect(evicted, low, high, deadline)
    top = high if best is None else best.schedule.peak
    return _bisect(backward, low, top, deadline) or best


def _bisect(
    fitting: Callable[[int], Member | None], low: int, high: int, deadline: float | None
) -> Member | None:
    """The member of least peak `fitting` gave while bisecting budgets between low (assumed not
    to fit) and high bytes, to a thousandth of high; None when none fitted."""
    best = None
    while high - low > max(1, high // 1000):
        if deadline is not None and time.perf_counter() > deadline:
            break
        middle = (low + high) // 2
        member = fitting(middle)
        if member is not None:
            best, high = member, min(middle, member.schedule.peak)
        else:
            low = middle
    return best
