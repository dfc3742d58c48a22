"""The cascade cover's bound by row generation (`cascade_bound`), and what its solutions say
to drop and keep (`away_stages`).

The model and the check of which rows a solution breaks are `solver.milp.cascade`'s. Rows are
added a few per round, first to the LP (HiGHS, re-solved from its last basis as the model grows,
each bound certified from the duals: `solver.milp.dual_bound`), then to the 0/1 model (HiGHS's
branch and cut).
Any subset of the rows is a relaxation, so every round's bound holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from solver.core.graph import Problem
from solver.deadline import Deadline
from solver.milp.cascade import CascadeModel, Crossings, cascade_model, violated_rows
from solver.milp.cpsat import ProgressFn
from solver.milp.dual_bound import GrowingLp
from solver.milp.highs_mip import HighsMip
from solver.milp.units import safe_floor


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
) -> CascadeBound:
    """Lower bound on the recompute cost of every schedule within `budget` from the cascade
    cover, by row generation until `deadline`: rows start at
    the stage of largest excess, and the rows a solution breaks (`violated_rows`) are added,
    ROWS_PER_ROUND per round. Every round's bound is valid (any subset of rows is a relaxation),
    so the bound only rises.

    1. on the LP (HiGHS, each bound certified from the duals, `solver.dual_bound`; each round
       from the last one's basis), until a solution breaks no row and the rows nearest to
       breaking, added once, do not raise the bound;
    2. on the 0/1 model (HiGHS's branch and cut, one thread, with the last LP's reduced-cost
       fixings at `cap`, the incumbent's recompute cost minus one when known; its bound read
       through `safe_floor`, NOTE [certificates]), until a solution breaks no row or the time
       is up. No solution within the cap proves that nothing costs at most the cap. CP-SAT,
       run here before, left the LP's bound where it was in 60 s on BERT-12, GPT-2-4 and
       ViT-12 at per-block checkpoint's memory; HiGHS proves GPT-2-4's 0/1 optimum in 2 s
       (docs/solver.md, "The cascade cover").

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

    lp = None
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
    lp_bound = lower
    values: Sequence[float] | None = None if lp is None else lp.values
    fixed = {} if lp is None or cap is None else lp.fixings(cap)
    while cap is None or lower <= cap:
        result = HighsMip(model.lm).solve(
            deadline=deadline,
            fixed=fixed,
            objective_cap=sum(model.lm.objective.values()) if cap is None else cap,
        )
        # NOTE [certificates]: HiGHS's bound, made safe; INFEASIBLE (nothing costs <= cap, so
        # every schedule costs more) reports cap + 0.5, read the same way
        lower = max(lower, safe_floor(result.bound))
        if result.status == "INFEASIBLE":
            assert cap is not None, "the model is feasible for every budget over the one-line bound"
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


def away_stages(model: CascadeModel, values: Sequence[float]) -> tuple[dict[int, int], set[int]]:
    """What a solution says to drop and keep: the first stage at which each value is away (x or
    a above one half), and the dead values it keeps past their last read (K above one half at
    some row), for `solver.lifetimes.start_from_away`."""
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
