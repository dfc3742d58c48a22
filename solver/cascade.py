r"""The cascade cover: the read-gap cover (`solver.cover_bound`) with the inputs a recompute needs.

The read-gap cover lets a value i be away in a read gap for the cost of one recompute of i. But
recomputing i needs i's inputs live at that moment, and at op level an input is often *dead* by
then: its last reader was i's first computation (a GELU's `pow` and `mul` intermediates, a
convolution's padded input). Such an input must be kept past its last read or recomputed too,
and so on down the chain: the cascade that makes cheap-looking recomputes expensive.

Rows are the stages t whose checkpoint-all live bytes exceed the budget (`excess_t > 0`: node t,
its inputs, its transient bytes and every value crossing t). A value p is *dead at t* when its
last reader comes no later than t (`last[p] <= t`). Variables (all 0/1):

    x[i,g]   i is away somewhere in read gap g (as in the read-gap cover; cost cost_i)
    a[i,t]   i is not kept into stage t + 1 (row t in gap g of i; only where i has an input
             dead at t): a[i,t] <= x[i,g]
    K[p,t]   p (dead at t) is kept into stage t + 1: its bytes count at row t
    L[p,t]   p (dead at t) is recomputed in some stage after t; L[p,t'] <= L[p,t] for t < t'
             (rows); cost cost_p once, on p's first L

    revival     a[i,t] <= K[p,t] + L[p,t]      each input p of i dead at t
    cascade     L[p,t] <= K[q,t] + L[q,t]      each input q of p dead at t
    memory      sum_{i crossing t} mem_i (a[i,t] or x[i,g]) - sum_{p dead at t, not read by t}
                mem_p K[p,t] >= excess_t

Every schedule within the budget gives a solution of no higher cost, so the optimum (and any
lower bound on it) bounds the recompute cost of every schedule:

- i away at t (not kept into t + 1) is live again at its next read r > t, so some stage
  s in (t, r] recomputes it, and each input p is live at s. If p is dead at t, p's copy live at s
  was computed after t (L[p,t]) or before, and then it is kept into t + 1 (K[p,t]). The same
  holds for the inputs of p's recompute (cascade), which also comes after t.
- the recomputes counted are distinct: those of x lie inside i's read gaps, which are disjoint
  and end at or before i's last read; the one of L lies after p's last read.
- at row t the live bytes are node t's compute floor, the crossing values kept and the dead
  values kept (K), so the crossing values away must cover the excess plus the kept dead bytes.

Without dead inputs the model is the read-gap cover. Its LP relaxation is strong: on op-level
graphs of real models (`benchmarks.solver_scale`) it lies within a few tenths of a percent of
the optimum of the model, and it solves in seconds where the stage model's LP does not finish;
`cascade_bound` takes the LP's bound (certified from its duals, `solver.dual_bound`) and then
lets CP-SAT raise it. What it leaves out: when in a gap a recompute happens (a value recomputed
early for another recompute is live from then on), and the memory in the middle of a stage.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from solver.cpsat import CpSatModel, ProgressFn
from solver.dual_bound import certified_lp_bound
from solver.formulation import LinearModel
from solver.graph import Problem


@dataclass(frozen=True)
class CascadeModel:
    """The cascade cover of one (problem, budget): the model and what its variables mean.

    gaps[k] = (value, first stage, last stage) of the read gap of x variable `gap_var[k]`;
    away[(i, t)]: the variable saying i is not kept into stage t + 1 (a or x) at row t;
    kept_dead[(p, t)]: K[p,t]."""

    lm: LinearModel
    rows: tuple[int, ...]
    gaps: tuple[tuple[int, int, int], ...]
    gap_var: tuple[int, ...]
    away: dict[tuple[int, int], int]
    kept_dead: dict[tuple[int, int], int]


def _last_reads(problem: Problem) -> list[int]:
    return [max(users, default=v) for v, users in enumerate(problem.succs)]


def _compute_floor(problem: Problem, t: int) -> int:
    """Bytes live when node t is computed in any schedule: t, its inputs and its transient."""
    return problem.mem[t] + sum(problem.mem[p] for p in problem.preds[t])


def cascade_model(problem: Problem, budget: int, int_cost: Sequence[int]) -> CascadeModel:
    """The model of the module docstring at `budget` bytes, costs in `int_cost` units.
    O(sum over rows of the values crossing them, plus the dead chains revived)."""
    n, mem = problem.n, problem.mem
    last = _last_reads(problem)
    gaps: list[tuple[int, int, int]] = []
    crossing: list[list[int]] = [[] for _ in range(n)]  # gap indices
    for i in range(n):
        if mem[i] == 0:
            continue
        previous = i
        for read in problem.succs[i]:
            if read > previous + 1:
                for t in range(previous + 1, read):
                    crossing[t].append(len(gaps))
                gaps.append((i, previous + 1, read - 1))
            previous = read
    excess = [
        _compute_floor(problem, t) + sum(mem[gaps[k][0]] for k in crossing[t]) - budget
        for t in range(n)
    ]
    rows = tuple(t for t in range(n) if excess[t] > 0)
    lm = LinearModel()
    gap_var: dict[int, int] = {}
    away: dict[tuple[int, int], int] = {}
    kept: dict[tuple[int, int], int] = {}
    later: dict[tuple[int, int], int] = {}
    kept_at: dict[int, list[int]] = {}  # row -> dead values with K there

    def revive(trigger: int, p: int, t: int) -> None:
        """trigger <= K[p,t] + L[p,t]; on first use, the cascade for p's own dead inputs."""
        if (p, t) not in kept:
            kept[p, t] = lm.var(f"K[{p},{t}]", 0, 1)
            later[p, t] = lm.var(f"L[{p},{t}]", 0, 1)
            kept_at.setdefault(t, []).append(p)
            for q in problem.preds[p]:
                if mem[q] and last[q] <= t:
                    revive(later[p, t], q, t)
        lm.row([(1, trigger), (-1, kept[p, t]), (-1, later[p, t])], None, 0)

    for t in rows:
        for k in crossing[t]:
            i = gaps[k][0]
            if k not in gap_var:
                gap_var[k] = lm.var(f"x[{i},{gaps[k][1]}..{gaps[k][2]}]", 0, 1)
                lm.objective[gap_var[k]] = int_cost[i]
            dead = [p for p in problem.preds[i] if mem[p] and last[p] <= t]
            if not dead:
                away[i, t] = gap_var[k]
                continue
            away[i, t] = lm.var(f"a[{i},{t}]", 0, 1)
            lm.row([(1, away[i, t]), (-1, gap_var[k])], None, 0)
            for p in dead:
                revive(away[i, t], p, t)
    by_value: dict[int, list[int]] = {}
    for p, t in later:
        by_value.setdefault(p, []).append(t)
    for p, stages in by_value.items():
        stages.sort()
        for t0, t1 in pairwise(stages):
            lm.row([(1, later[p, t1]), (-1, later[p, t0])], None, 0)
        if int_cost[p]:
            lm.objective[later[p, stages[0]]] = int_cost[p]
    for t in rows:
        read = set(problem.preds[t])
        terms = [(mem[gaps[k][0]], away[gaps[k][0], t]) for k in crossing[t]]
        terms += [(-mem[p], kept[p, t]) for p in kept_at.get(t, ()) if p not in read]
        lm.row(terms, excess[t], None)
    order = sorted(gap_var)
    return CascadeModel(
        lm,
        rows,
        tuple(gaps[k] for k in order),
        tuple(gap_var[k] for k in order),
        away,
        kept,
    )


@dataclass(frozen=True)
class CascadeBound:
    """bound: proven lower bound on the recompute cost (`int_cost` units) of every stage
    schedule within the budget (at most `cap + 1` when a cap was given: schedules costing more
    than the cap are not claimed); values: the best solution of the model found (None if none),
    for `keep_fractions`; lp_bound: the LP's certified part of the bound."""

    bound: int
    lp_bound: int
    values: list[int] | None
    model: CascadeModel


def cascade_bound(
    problem: Problem,
    budget: int,
    int_cost: Sequence[int],
    *,
    deadline: float,
    workers: int,
    cap: int | None = None,
    progress: ProgressFn | None = None,
) -> CascadeBound:
    """Lower bound on the recompute cost of every schedule within `budget`: the cascade cover's
    LP bound (HiGHS, certified from its duals), then CP-SAT on the model with the LP's
    reduced-cost fixings at `cap` (the incumbent's recompute cost minus one, when known) until
    `deadline` (`time.perf_counter()` seconds). CP-SAT finding no solution within the cap proves
    that nothing costs at most the cap. `progress` gets (seconds since the call, objective,
    bound) in `int_cost` units as CP-SAT improves."""
    started = time.perf_counter()
    model = cascade_model(problem, budget, int_cost)
    lm = model.lm
    if not lm.rows:
        return CascadeBound(0, 0, None, model)
    lp = certified_lp_bound(lm, deadline - time.perf_counter())
    lower = 0 if lp is None else lp.bound
    if cap is not None and lower > cap:
        return CascadeBound(cap + 1, cap + 1, None, model)
    fixed = {} if lp is None or cap is None else lp.fixings(cap)
    if progress is not None:
        progress(time.perf_counter() - started, math.inf, lower)
    left = deadline - time.perf_counter()
    result = CpSatModel(lm).solve(
        time_limit=left,
        workers=workers,
        fixed=fixed,
        objective_cap=cap,
        progress=progress and _shifted(progress, started),
    )
    if result.status == "INFEASIBLE":  # no solution of cost <= cap: every schedule costs more
        assert cap is not None, "the model is feasible for every budget above the one-line bound"
        return CascadeBound(cap + 1, lower, None, model)
    proven = result.objective if result.status == "OPTIMAL" else math.ceil(result.bound - 1e-6)
    bound = max(lower, proven or 0)
    if cap is not None:
        bound = min(bound, cap + 1)
    return CascadeBound(bound, lower, result.values, model)


def _shifted(progress: ProgressFn, started: float) -> ProgressFn:
    def report(_: float, objective: float, bound: float) -> None:
        progress(time.perf_counter() - started, objective, bound)

    return report


def keep_fractions(
    problem: Problem, model: CascadeModel, values: Sequence[float]
) -> list[dict[int, float]]:
    """Per stage t = 0..n, how much the solution `values` keeps each value into stage t (1 where
    the model says nothing about it: a value with a later read is kept unless away), the form
    `solver.eviction.evict_by_keep` takes."""
    n = problem.n
    last = _last_reads(problem)
    fractions: list[dict[int, float]] = [{} for _ in range(n + 1)]
    for v in range(n):
        for t in range(v, last[v]):
            fractions[t + 1][v] = 1.0
    for (i, first, final), var in zip(model.gaps, model.gap_var, strict=True):
        for t in range(first, final + 1):
            fractions[t + 1][i] = 1.0 - values[model.away.get((i, t), var)]
    for (p, t), var in model.kept_dead.items():
        fractions[t + 1][p] = max(fractions[t + 1].get(p, 0.0), float(values[var]))
    return fractions
