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

from solver.core.graph import Problem
from solver.deadline import Deadline
from solver.milp.cpsat import CpSatModel, ProgressFn
from solver.milp.dual_bound import certified_lp_bound
from solver.milp.model import LinearModel


@dataclass(frozen=True)
class Crossings:
    """The read gaps of a problem at a budget: gaps[k] = (value, first stage, last stage) of
    each read gap of a value with bytes; crossing[t]: the gaps that contain stage t; excess[t]:
    bytes over the budget at stage t in checkpoint-all (node t's compute floor plus every value
    crossing t); last[v]: the stage of v's last reader (v itself when none)."""

    gaps: tuple[tuple[int, int, int], ...]
    crossing: tuple[tuple[int, ...], ...]
    excess: tuple[int, ...]
    last: tuple[int, ...]

    @classmethod
    def of(cls, problem: Problem, budget: int) -> Crossings:
        """O(sum of gap lengths)."""
        n, mem = problem.n, problem.mem
        gaps: list[tuple[int, int, int]] = []
        crossing: list[list[int]] = [[] for _ in range(n)]
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
        excess = tuple(
            problem.compute_floor(t) + sum(mem[gaps[k][0]] for k in crossing[t]) - budget
            for t in range(n)
        )
        last = tuple(max(users, default=v) for v, users in enumerate(problem.succs))
        return cls(tuple(gaps), tuple(map(tuple, crossing)), excess, last)

    @property
    def tight(self) -> tuple[int, ...]:
        """The stages over the budget in checkpoint-all: the rows a model may have."""
        return tuple(t for t, e in enumerate(self.excess) if e > 0)


@dataclass(frozen=True)
class CascadeModel:
    """The cascade cover of one (problem, budget) over some rows: the model and what its
    variables mean. gap_var[k]: the x variable of read gap k (`Crossings.gaps`), where one
    exists; away[(i, t)]: the variable saying i is not kept into stage t + 1 (a or x) at row
    t; kept_dead[(p, t)]: K[p,t]; later[(p, t)]: L[p,t]."""

    lm: LinearModel
    crossings: Crossings
    rows: tuple[int, ...]
    gap_var: dict[int, int]
    away: dict[tuple[int, int], int]
    kept_dead: dict[tuple[int, int], int]
    later: dict[tuple[int, int], int]


def cascade_model(
    problem: Problem,
    crossings: Crossings,
    int_cost: Sequence[int],
    rows: Sequence[int] | None = None,
    timing: bool = True,
) -> CascadeModel:
    """The model of the module docstring with a row for each of `rows` (default: every stage
    over the budget; any subset of them is still a relaxation), costs in `int_cost` units, and
    with `timing` the second recomputes of crossing inputs (`_second_recomputes`).
    O(sum over rows of the values crossing them, plus the dead chains revived)."""
    mem, gaps, crossing, last = problem.mem, crossings.gaps, crossings.crossing, crossings.last
    rows = tuple(sorted(crossings.tight if rows is None else rows))
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
            if not dead and not timing:
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
    if timing:
        _second_recomputes(problem, crossings, int_cost, rows, lm, away)
    for t in rows:
        read = set(problem.preds[t])
        terms = [(mem[gaps[k][0]], away[gaps[k][0], t]) for k in crossing[t]]
        terms += [(-mem[p], kept[p, t]) for p in kept_at.get(t, ()) if p not in read]
        lm.row(terms, crossings.excess[t], None)
    return CascadeModel(lm, crossings, rows, gap_var, away, kept, later)


def _second_recomputes(
    problem: Problem,
    crossings: Crossings,
    int_cost: Sequence[int],
    rows: Sequence[int],
    lm: LinearModel,
    away: dict[tuple[int, int], int],
) -> None:
    """Timing: v away at row t is recomputed at some s in (t, r], r its next read, and each
    input p is live at s. If p crosses t in a gap that runs past r, is away at t (so its copy at
    s was recomputed after t) and away at a row u in [r, its next read) (so that copy is gone by
    u + 1), p is recomputed twice in that gap: a[v,t] + a[p,t] + a[p,u] - D[p,g] <= 2, D[p,g]
    costing one more recompute of p (beyond the read-gap cover's x, in the same gap; beyond L,
    which comes after p's last read)."""
    gaps = crossings.gaps
    gap_at = {(gaps[k][0], t): k for t in rows for k in crossings.crossing[t]}
    twice: dict[int, int] = {}
    for t in rows:
        for k in crossings.crossing[t]:
            v, _, last_row = gaps[k]
            read = last_row + 1
            for p in problem.preds[v]:
                h = gap_at.get((p, t))
                if h is None or gaps[h][2] < read:
                    continue
                later_rows = [u for u in rows if read <= u <= gaps[h][2]]
                for u in later_rows:
                    if h not in twice:
                        twice[h] = lm.var(f"D[{p},{gaps[h][1]}..{gaps[h][2]}]", 0, 1)
                        if int_cost[p]:
                            lm.objective[twice[h]] = int_cost[p]
                    terms = [(1, away[v, t]), (1, away[p, t]), (1, away[p, u]), (-1, twice[h])]
                    lm.row(terms, None, 2)


def violated_rows(
    problem: Problem, model: CascadeModel, values: Sequence[float], tolerance: float = 1e-6
) -> list[int]:
    """The stages over the budget without a row in `model` whose row the solution `values`
    would break, most broken first: each gap crossing t away as much as its x (0 where the gap
    has no variable), each dead input revived by its L at the nearest modelled row before t and
    otherwise kept (its bytes count). A heuristic check: adding any rows keeps a relaxation."""
    mem, crossings = problem.mem, model.crossings
    gaps, last = crossings.gaps, crossings.last
    modelled = set(model.rows)
    later_rows: dict[int, list[int]] = {}
    for p, t in model.later:
        later_rows.setdefault(p, []).append(t)
    for stages in later_rows.values():
        stages.sort()
    broken: list[tuple[float, int]] = []
    for t in crossings.tight:
        if t in modelled:
            continue
        credit = 0.0
        demand: dict[int, float] = {}
        for k in crossings.crossing[t]:
            i = gaps[k][0]
            x = values[model.gap_var[k]] if k in model.gap_var else 0.0
            credit += mem[i] * x
            for p in problem.preds[i]:
                if mem[p] and last[p] <= t and p not in problem.preds[t]:
                    demand[p] = max(demand.get(p, 0.0), x)
        for p, wanted in demand.items():
            before = [s for s in later_rows.get(p, ()) if s <= t]
            revived = values[model.later[p, before[-1]]] if before else 0.0
            credit -= mem[p] * max(0.0, wanted - revived)
        need = crossings.excess[t] - credit
        if need > tolerance * crossings.excess[t]:
            broken.append((need / crossings.excess[t], t))
    return [t for _, t in sorted(broken, reverse=True)]


@dataclass(frozen=True)
class CascadeBound:
    """bound: proven lower bound on the recompute cost (`int_cost` units) of every stage
    schedule within the budget (at most `cap + 1` when a cap was given: schedules costing more
    than the cap are not claimed); values: the best solution of the model CP-SAT found, else
    the LP's (fractional), else None, for `away_stages`; lp_bound: the LP's certified part
    of the bound; model: the model they belong to (its last rows)."""

    bound: int
    lp_bound: int
    values: Sequence[float] | None
    model: CascadeModel


ROWS_PER_ROUND = 8
"""Rows `cascade_bound` adds per round of row generation: the LP optimum of the full model has
1-2 binding memory rows on the op-level graphs measured (ResNet-50, MobileNetV3, Llama-4 at 50%,
out of 238-419), so a few rounds of a few rows reach it."""


def cascade_bound(
    problem: Problem,
    budget: int,
    int_cost: Sequence[int],
    *,
    deadline: Deadline,
    workers: int,
    cap: int | None = None,
    progress: ProgressFn | None = None,
    lp_share: float = 0.3,
    rows: Sequence[int] = (),
) -> CascadeBound:
    """Lower bound on the recompute cost of every schedule within `budget` from the cascade
    cover, by row generation until `deadline`: rows start at
    the stage of largest excess, and the rows a solution breaks (`violated_rows`) are added,
    ROWS_PER_ROUND per round. Every round's bound is valid (any subset of rows is a relaxation),
    so the bound only rises.

    1. on the LP (HiGHS, each bound certified from the duals, `solver.dual_bound`), for at most
       `lp_share` of the time;
    2. on the 0/1 model (CP-SAT, with the last LP's reduced-cost fixings at `cap`, the
       incumbent's recompute cost minus one when known), each round from the last solution,
       until a solution breaks no row or the time is up. No solution within the cap proves
       that nothing costs at most the cap.

    `rows` (say, an earlier call's `model.rows`) are the rows to begin with, besides the stage
    of largest excess. `progress` gets (seconds since the call, objective, bound) in `int_cost`
    units."""
    started = time.perf_counter()
    crossings = Crossings.of(problem, budget)
    tight = crossings.tight
    rows = sorted({*rows, max(tight, key=crossings.excess.__getitem__)}) if tight else []
    model = cascade_model(problem, crossings, int_cost, rows)
    if not tight:
        return CascadeBound(0, 0, None, model)
    lower = 0

    def report(objective: float, bound: float) -> None:
        if progress is not None:
            progress(time.perf_counter() - started, objective, max(lower, bound))

    lp_deadline = deadline.share(lp_share)
    lp = None
    while True:
        solved = certified_lp_bound(model.lm, lp_deadline)
        if solved is None:
            break
        lp, lower = solved, max(lower, solved.bound)
        report(math.inf, lower)
        assert lp.values is not None
        broken = violated_rows(problem, model, lp.values)
        if not broken or lp_deadline.passed():
            break
        rows += broken[:ROWS_PER_ROUND]
        model = cascade_model(problem, crossings, int_cost, rows)
        lp = None
    lp_bound = lower
    values: Sequence[float] | None = None if lp is None else lp.values
    fixed = {} if lp is None or cap is None else lp.fixings(cap)
    while cap is None or lower <= cap:
        result = CpSatModel(model.lm).solve(
            deadline=deadline,
            workers=workers,
            fixed=fixed,
            hint=None if values is None else _hint(model, values),
            objective_cap=cap,
            progress=progress and (lambda _, objective, bound: report(objective, bound)),
        )
        if result.status == "INFEASIBLE":  # no solution of cost <= cap: every schedule costs more
            assert cap is not None, "the model is feasible for every budget over the one-line bound"
            lower = cap + 1
            break
        proven = result.objective if result.status == "OPTIMAL" else math.ceil(result.bound - 1e-6)
        lower = max(lower, proven or 0)
        report(math.inf, lower)
        if result.values is None:
            break
        values = result.values
        broken = violated_rows(problem, model, values)
        if result.status != "OPTIMAL" or not broken:
            break
        rows += broken[:ROWS_PER_ROUND]
        old, model = model, cascade_model(problem, crossings, int_cost, rows)
        values, fixed = _carried(old, model, values), {}
    if cap is not None:
        lower = min(lower, cap + 1)
    return CascadeBound(lower, min(lp_bound, lower), values, model)


def _hint(model: CascadeModel, values: Sequence[float]) -> dict[int, int]:
    """A 0/1 hint from (possibly fractional) values: rounded."""
    return {j: int(v > 0.5) for j, v in enumerate(values)}


def _carried(old: CascadeModel, new: CascadeModel, values: Sequence[float]) -> list[float]:
    """`values` of `old` moved onto `new`'s variables by name (0 for new variables)."""
    by_name = dict(zip(old.lm.names, values, strict=True))
    return [by_name.get(name, 0.0) for name in new.lm.names]


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
