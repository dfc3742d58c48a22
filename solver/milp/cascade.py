r"""The cascade cover: the read-gap cover (`solver.milp.cover`) with the inputs a recompute needs.

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
graphs of real models (`benchmarks.solving.solver_scale`) it lies within a few tenths of a percent
of
the optimum of the model, and it solves in seconds where the stage model's LP does not finish;
`solver.milp.cascade_rounds.cascade_bound` takes the LP's bound (certified from its duals,
`solver.milp.lp`) and then lets HiGHS's branch and cut raise it. What it leaves out:
when in a gap a recompute happens (a value recomputed early for another recompute is live from
then on), and the memory in the middle of a stage.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from solver.core.graph import Problem
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


@dataclass
class CascadeModel:
    """The cascade cover of one (problem, budget) over some rows, grown row by row
    (`add_rows`): the model and what its variables mean. gap_var[k]: the x variable of read gap
    k (`Crossings.gaps`), where one exists; away[(i, t)]: the variable saying i is not kept into
    stage t + 1 (a or x) at row t; kept_dead[(p, t)]: K[p,t]; later[(p, t)]: L[p,t]; with
    `timing`, the second recomputes of crossing inputs (`_second_recomputes`); costs in
    `int_cost` units.

    Adding rows only appends variables and rows to `lm` and may move a value's L cost to an
    earlier L (its first): the variables and rows already there keep their indices and
    meaning, so a solution of the smaller model extends to the larger one with zeros, and an LP
    solved on it resumes from its basis (`solver.milp.lp.GrowingLp`)."""

    problem: Problem
    crossings: Crossings
    int_cost: Sequence[int]
    timing: bool = True
    lm: LinearModel = field(default_factory=LinearModel)
    rows: tuple[int, ...] = ()
    gap_var: dict[int, int] = field(default_factory=dict)
    away: dict[tuple[int, int], int] = field(default_factory=dict)
    kept_dead: dict[tuple[int, int], int] = field(default_factory=dict)
    later: dict[tuple[int, int], int] = field(default_factory=dict)
    _kept_at: dict[int, list[int]] = field(default_factory=dict)  # row -> dead values with K
    later_rows: dict[int, list[int]] = field(default_factory=dict)
    """For each dead value p revived somewhere, the rows with an L[p, t], ascending."""
    _twice: dict[int, int] = field(default_factory=dict)  # gap -> D
    _checks: dict[int, _RowCheck] = field(default_factory=dict)

    def row_check(self, t: int) -> _RowCheck:
        """What `violated_rows` reads at stage t (built once per stage)."""
        if t not in self._checks:
            self._checks[t] = _RowCheck.at(self.problem, self.crossings, t)
        return self._checks[t]

    def add_rows(self, rows: Iterable[int]) -> None:
        """Add the rows of `rows` not in the model yet (stages over the budget)."""
        new = sorted(set(rows) - set(self.rows))
        if not new:
            return
        revived: list[tuple[int, int]] = []
        for t in new:
            self._away_at(t, revived)
        self._order_later(revived)
        self.rows = tuple(sorted({*self.rows, *new}))
        if self.timing:
            self._second_recomputes(set(new))
        for t in new:
            self._memory_row(t)

    def _away_at(self, t: int, revived: list[tuple[int, int]]) -> None:
        """x of each gap crossing t, a[i,t] <= x, and the revival of i's dead inputs."""
        problem, lm, gaps = self.problem, self.lm, self.crossings.gaps
        mem, last = problem.mem, self.crossings.last
        for k in self.crossings.crossing[t]:
            i = gaps[k][0]
            if k not in self.gap_var:
                self.gap_var[k] = lm.var(f"x[{i},{gaps[k][1]}..{gaps[k][2]}]", 0, 1)
                lm.objective[self.gap_var[k]] = self.int_cost[i]
            dead = [p for p in problem.preds[i] if mem[p] and last[p] <= t]
            if not dead and not self.timing:
                self.away[i, t] = self.gap_var[k]
                continue
            self.away[i, t] = lm.var(f"a[{i},{t}]", 0, 1)
            lm.row([(1, self.away[i, t]), (-1, self.gap_var[k])], None, 0)
            for p in dead:
                self._revive(self.away[i, t], p, t, revived)

    def _revive(self, trigger: int, p: int, t: int, revived: list[tuple[int, int]]) -> None:
        """trigger <= K[p,t] + L[p,t]; on first use, the cascade for p's own dead inputs."""
        problem, lm = self.problem, self.lm
        if (p, t) not in self.kept_dead:
            self.kept_dead[p, t] = lm.var(f"K[{p},{t}]", 0, 1)
            self.later[p, t] = lm.var(f"L[{p},{t}]", 0, 1)
            self._kept_at.setdefault(t, []).append(p)
            revived.append((p, t))
            for q in problem.preds[p]:
                if problem.mem[q] and self.crossings.last[q] <= t:
                    self._revive(self.later[p, t], q, t, revived)
        lm.row([(1, trigger), (-1, self.kept_dead[p, t]), (-1, self.later[p, t])], None, 0)

    def _order_later(self, revived: list[tuple[int, int]]) -> None:
        """L[p,t'] <= L[p,t] for consecutive rows t < t' of p (a row added between two keeps
        the one that spanned it, now implied), and p's cost on its first L."""
        lm, later = self.lm, self.later
        for p, t in revived:
            stages = self.later_rows.setdefault(p, [])
            at = bisect.bisect(stages, t)
            if at < len(stages):
                lm.row([(1, later[p, stages[at]]), (-1, later[p, t])], None, 0)
            if at > 0:
                lm.row([(1, later[p, t]), (-1, later[p, stages[at - 1]])], None, 0)
            elif self.int_cost[p]:
                if stages:
                    del lm.objective[later[p, stages[0]]]
                lm.objective[later[p, t]] = self.int_cost[p]
            stages.insert(at, t)

    def _second_recomputes(self, new: set[int]) -> None:
        """Timing, for the pairs of rows (t, u) of which one is in `new`: v away at row t is
        recomputed at some s in (t, r], r its next read, and each input p is live at s. If p
        crosses t in a gap that runs past r, is away at t (so its copy at s was recomputed after
        t) and away at a row u in [r, its next read) (so that copy is gone by u + 1), p is
        recomputed twice in that gap: a[v,t] + a[p,t] + a[p,u] - D[p,g] <= 2, D[p,g] costing
        one more recompute of p (beyond the read-gap cover's x, in the same gap; beyond L,
        which comes after p's last read)."""
        problem, lm, away = self.problem, self.lm, self.away
        gaps, crossing = self.crossings.gaps, self.crossings.crossing
        for t in self.rows:
            gap_of = {gaps[k][0]: k for k in crossing[t]}
            for k in crossing[t]:
                v, _, last_row = gaps[k]
                read = last_row + 1
                for p in problem.preds[v]:
                    h = gap_of.get(p)
                    if h is None or gaps[h][2] < read:
                        continue
                    for u in self.rows:
                        if not read <= u <= gaps[h][2] or (t not in new and u not in new):
                            continue
                        if h not in self._twice:
                            self._twice[h] = lm.var(f"D[{p},{gaps[h][1]}..{gaps[h][2]}]", 0, 1)
                            if self.int_cost[p]:
                                lm.objective[self._twice[h]] = self.int_cost[p]
                        terms = [(1, away[v, t]), (1, away[p, t]), (1, away[p, u])]
                        lm.row([*terms, (-1, self._twice[h])], None, 2)

    def _memory_row(self, t: int) -> None:
        """The crossing values away cover the excess plus the dead values kept at row t."""
        mem, gaps, kept = self.problem.mem, self.crossings.gaps, self.kept_dead
        read = set(self.problem.preds[t])
        terms = [(mem[gaps[k][0]], self.away[gaps[k][0], t]) for k in self.crossings.crossing[t]]
        terms += [(-mem[p], kept[p, t]) for p in self._kept_at.get(t, ()) if p not in read]
        self.lm.row(terms, self.crossings.excess[t], None)


def cascade_model(
    problem: Problem,
    crossings: Crossings,
    int_cost: Sequence[int],
    rows: Sequence[int] | None = None,
    timing: bool = True,
) -> CascadeModel:
    """The model of the module docstring with a row for each of `rows` (default: every stage
    over the budget; any subset of them is still a relaxation). O(sum over rows of the values
    crossing them, plus the dead chains revived)."""
    model = CascadeModel(problem, crossings, int_cost, timing)
    model.add_rows(crossings.tight if rows is None else rows)
    return model


@dataclass(frozen=True)
class _RowCheck:
    """What `violated_rows` reads at one stage t: the gaps crossing t and their values' bytes;
    the dead inputs (not read by t) of those values and their bytes; and each (dead input, gap)
    pair as positions in those two lists."""

    gaps: np.ndarray
    gap_bytes: np.ndarray
    dead: list[int]
    dead_bytes: np.ndarray
    pair_dead: np.ndarray
    pair_gap: np.ndarray

    @classmethod
    def at(cls, problem: Problem, crossings: Crossings, t: int) -> _RowCheck:
        mem, last, gaps = problem.mem, crossings.last, crossings.gaps
        crossing = crossings.crossing[t]
        read = set(problem.preds[t])
        dead: dict[int, int] = {}
        pairs: list[tuple[int, int]] = []
        for position, k in enumerate(crossing):
            for p in problem.preds[gaps[k][0]]:
                if mem[p] and last[p] <= t and p not in read:
                    pairs.append((dead.setdefault(p, len(dead)), position))
        return cls(
            np.asarray(crossing, np.int64),
            np.asarray([mem[gaps[k][0]] for k in crossing], float),
            list(dead),
            np.asarray([mem[p] for p in dead], float),
            np.asarray([d for d, _ in pairs], np.int64),
            np.asarray([g for _, g in pairs], np.int64),
        )


def violated_rows(
    model: CascadeModel, values: Sequence[float], tolerance: float = 1e-6
) -> list[int]:
    """The stages over the budget without a row in `model` whose row the solution `values`
    would break by more than `tolerance` of its excess, most broken first: each gap crossing t
    away as much as its x (0 where the gap has no variable), each dead input revived by its L at
    the nearest modelled row before t and otherwise kept (its bytes count). A heuristic check:
    adding any rows keeps a relaxation."""
    crossings = model.crossings
    values = np.asarray(values, float)
    away = np.zeros(len(crossings.gaps))
    away[list(model.gap_var)] = values[list(model.gap_var.values())]
    modelled = set(model.rows)
    broken: list[tuple[float, int]] = []
    for t in crossings.tight:
        if t in modelled:
            continue
        check = model.row_check(t)
        x = away[check.gaps]
        credit = float(check.gap_bytes @ x)
        if check.dead:
            wanted = np.zeros(len(check.dead))
            np.maximum.at(wanted, check.pair_dead, x[check.pair_gap])
            revived = np.zeros(len(check.dead))
            for position, p in enumerate(check.dead):
                stages = model.later_rows.get(p, ())
                before = bisect.bisect(stages, t)
                if before:
                    revived[position] = values[model.later[p, stages[before - 1]]]
            credit -= float(check.dead_bytes @ np.maximum(0.0, wanted - revived))
        need = crossings.excess[t] - credit
        if need > tolerance * crossings.excess[t]:
            broken.append((need / crossings.excess[t], t))
    return [t for _, t in sorted(broken, reverse=True)]
