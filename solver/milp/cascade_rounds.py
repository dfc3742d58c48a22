"""The cascade cover's bound by row generation (`cascade_bound`), and what its solutions say
to drop and keep (`away_stages`).

The model and the check of which rows a solution breaks are `solver.milp.cascade`'s. Rows are
added a few per round, first to the LP (HiGHS, re-solved from its last basis as the model grows,
each bound certified from the duals: `solver.milp.lp`), then to the 0/1 model (HiGHS's
branch and cut, or CP-SAT where a good 0/1 solution is wanted soon).
Any subset of the rows is a relaxation, so every round's bound holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from solver.core.graph import Problem
from solver.deadline import Deadline
from solver.milp.cascade import CascadeModel, Crossings, cascade_model, violated_rows
from solver.milp.cpsat import CpSatModel, ProgressFn
from solver.milp.highs_mip import HighsMip
from solver.milp.lp import DualBound, GrowingLp
from solver.milp.model import ModelResult


@dataclass(frozen=True)
class CascadeBound:
    """bound: proven lower bound on the recompute cost (`int_cost` units) of every stage
    schedule within the budget (at most `cap + 1` when a cap was given: schedules costing more
    than the cap are not claimed); values: the best solution of the 0/1 model found, else
    the LP's (fractional), else None, for `away_stages`; lp_bound: the LP's certified part
    of the bound; model: the model they belong to (its last rows)."""

    bound: int
    lp_bound: int
    values: Sequence[float] | None
    model: CascadeModel


ROWS_PER_ROUND = 4
"""Rows `cascade_bound` adds per round of row generation. Few: a round re-solves the LP from the
last basis (a few pivots), and which rows a solution breaks changes as rows are added, so rows
added many at a time are mostly rows the LP would never have needed (docs/solver.md, "Row
generation")."""


def cascade_bound(
    problem: Problem,
    budget: int,
    int_cost: Sequence[int],
    *,
    deadline: Deadline,
    cap: int | None = None,
    progress: ProgressFn | None = None,
    rows: Sequence[int] = (),
    cpsat_workers: int | None = None,
) -> CascadeBound:
    """Lower bound on the recompute cost of every schedule within `budget` from the cascade
    cover, by row generation until `deadline`: rows start at
    the stage of largest excess, and the rows a solution breaks (`violated_rows`) are added,
    ROWS_PER_ROUND per round. Every round's bound is valid (any subset of rows is a relaxation),
    so the bound only rises.

    1. on the LP (HiGHS, each bound certified from the duals, `solver.milp.lp`; each round
       from the last one's basis), until a solution breaks no row and the rows nearest to
       breaking, added once, do not raise the bound;
    2. on the 0/1 model (with the last LP's reduced-cost fixings at `cap`, the incumbent's
       recompute cost minus one when known), until a solution breaks no row or the time is
       up: HiGHS's branch and cut on one thread (what it proves read by
       `ModelResult.proven`, NOTE [safe bounds] in `solver.milp.units`), or, with
       `cpsat_workers`, CP-SAT from the last solution as a hint. No solution within the cap
       proves that nothing costs at most the cap. HiGHS raises the bound where CP-SAT leaves
       the LP's (BERT-12, GPT-2-4 and ViT-12 at per-block checkpoint's memory, 60 s);
       CP-SAT's local search finds good 0/1 solutions sooner (on BERT-12 there, 0.233 of
       the node costs in 2 s, where HiGHS's first is 0.246), which is what a caller wanting a
       solution to start from needs (docs/solver.md, "The cascade cover").

    `rows` (say, an earlier call's `model.rows`) are the rows to begin with, besides the stage
    of largest excess. `progress` gets (seconds since the call, objective, bound) in `int_cost`
    units."""
    started = time.perf_counter()
    crossings = Crossings.of(problem, budget)
    tight = crossings.tight
    rows = {*rows, max(tight, key=crossings.excess.__getitem__)} if tight else ()
    model = cascade_model(problem, crossings, int_cost, rows)
    if not tight:
        return CascadeBound(0, 0, None, model)
    lower = 0

    def report(objective: float, bound: float) -> None:
        if progress is not None:
            progress(time.perf_counter() - started, objective, max(lower, bound))

    lp, lower = _lp_rounds(model, deadline, report)
    lp_bound = lower
    values: Sequence[float] | None = None if lp is None else lp.values
    fixed = {} if lp is None or cap is None else lp.fixings(cap)
    while cap is None or lower <= cap:
        result, proven = _solve_01(model, cap, fixed, values, deadline, cpsat_workers, report)
        lower = max(lower, proven)
        if result.status == "INFEASIBLE":
            break
        report(math.inf if result.objective is None else result.objective, lower)
        if result.values is None:
            break
        values = result.values
        broken = violated_rows(model, values)
        if result.status != "OPTIMAL" or not broken:
            break
        model.add_rows(broken[:ROWS_PER_ROUND])
        values = [*values, *[0.0] * (len(model.lm.names) - len(values))]
        fixed = {}
    if cap is not None:
        lower = min(lower, cap + 1)
    return CascadeBound(lower, min(lp_bound, lower), values, model)


def _lp_rounds(
    model: CascadeModel, deadline: Deadline, report: Callable[[float, float], None]
) -> tuple[DualBound | None, int]:
    """Step 1 of `cascade_bound`: row generation on the LP, each round from the last one's
    basis, adding rows to `model`. The last LP solved where it broke no row (None where rows
    were added after it or none was solved), and the highest bound (0 without one)."""
    lp = None
    lower = 0
    relaxation = GrowingLp(model.lm)
    probing = False  # the rows last added were only the nearest to breaking
    while True:
        solved = relaxation.solve(deadline)
        if solved is None:
            break
        rose = solved.bound > lower
        lp, lower = solved, max(lower, solved.bound)
        report(math.inf, lower)
        assert lp.values is not None
        if probing and not rose:
            break
        broken = violated_rows(model, lp.values)
        probing = not broken
        if probing:  # the check is a heuristic: try the nearest rows once
            broken = violated_rows(model, lp.values, tolerance=-math.inf)
        if not broken or deadline.passed():
            break
        model.add_rows(broken[:ROWS_PER_ROUND])
        lp = None
    return lp, lower


def _solve_01(
    model: CascadeModel,
    cap: int | None,
    fixed: dict[int, int],
    values: Sequence[float] | None,
    deadline: Deadline,
    cpsat_workers: int | None,
    report: Callable[[float, float], None],
) -> tuple[ModelResult, int]:
    """One round on the 0/1 model (`cascade_bound`, 2.): the result, and the whole cost units
    it proves every solution within `cap` to cost at least (`cap` + 1 when none is within it)."""
    if cpsat_workers is None:
        result = HighsMip(model.lm).solve(
            deadline=deadline,
            fixed=fixed,
            objective_cap=sum(model.lm.objective.values()) if cap is None else cap,
        )
    else:
        result = CpSatModel(model.lm).solve(
            deadline=deadline,
            workers=cpsat_workers,
            fixed=fixed,
            hint=None if values is None else {j: int(v > 0.5) for j, v in enumerate(values)},
            objective_cap=cap,
            progress=lambda _, objective, bound: report(objective, bound),
        )
    if result.status == "INFEASIBLE":
        assert cap is not None, "the model is feasible for every budget over the one-line bound"
    return result, result.proven(cap)


def away_stages(model: CascadeModel, values: Sequence[float]) -> tuple[dict[int, int], set[int]]:
    """What a solution says to drop and keep: the first stage at which each value is away (x or
    a above one half), and the dead values it keeps past their last read (K above one half at
    some row), for `solver.heuristics.lifetimes.start_from_away`."""
    gaps = model.crossings.gaps
    first: dict[int, int] = {}
    for (i, t), var in model.away.items():
        if values[var] > 0.5 and t < first.get(i, t + 1):
            first[i] = t
    for k, var in model.gap_var.items():
        i, start, _ = gaps[k]
        if values[var] > 0.5 and all(values[v] > 0.5 for (j, _), v in model.away.items() if j == i):
            first[i] = min(first.get(i, start), start)
    kept = {p for (p, _), var in model.kept_dead.items() if values[var] > 0.5}
    return first, kept
