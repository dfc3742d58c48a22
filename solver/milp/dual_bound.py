r"""A certified lower bound from an LP relaxation, and the 0/1 fixings it implies.

For min c^T x s.t. lo <= A x <= hi, 0 <= x <= upper, ANY row multipliers y give

    c^T x = y^T A x + d^T x >= sum_r min(y_r lo_r, y_r hi_r) + sum_j d_j x_j,   d = c - A^T y,

where min(y_r lo_r, y_r hi_r) is y_r lo_r for y_r >= 0 and y_r hi_r otherwise (a multiplier on an
open side is dropped, as 0 is a multiplier too). So LB(y) = sum_r (that) + sum_j min(0, d_j upper_j)
bounds every feasible x, and for a 0/1 variable x_j,

    c^T x >= LB(y) + d_j x_j          (d_j > 0)        c^T x >= LB(y) + |d_j| (1 - x_j)  (d_j < 0)

so a solution of cost <= cap has x_j = 0 when LB(y) + d_j > cap (x_j = 1 when LB(y) + |d_j| >
cap). HiGHS's optimal duals make LB(y) the LP optimum; the arithmetic is redone here in floating
point with every rounding error bounded (relative 2^-52 per operation, summed over each sum's
terms), so the bound holds whatever HiGHS's tolerances were: this is the Neumaier-Shcherbina
safe bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import highspy
import numpy as np

from solver.deadline import Deadline
from solver.milp.lp import column_scales, dual_simplex, scale_rows
from solver.milp.model import LinearModel

_ROUNDING = 2.0**-52
"""Relative error of one float64 operation, doubled for safety."""


@dataclass(frozen=True)
class DualBound:
    """bound: a certified lower bound on the model's objective (a whole number: the objective
    has integer coefficients on integer variables); base: the real-valued LB(y) it rounds up;
    reduced: d_j and its error bound per variable (`fixings`); values: the LP's primal solution
    where it came from one (None from `safe_bound` alone)."""

    bound: int
    base: float
    reduced: np.ndarray
    error: np.ndarray
    values: np.ndarray | None = None

    def fixings(self, cap: int) -> dict[int, int]:
        """The 0/1 variables whose value is the same in every solution of objective <= cap."""
        d, e = self.reduced, self.error
        zero = np.flatnonzero(d - e > 0)
        zero = zero[self.base + d[zero] - e[zero] > cap]
        one = np.flatnonzero(d + e < 0)
        one = one[self.base - d[one] - e[one] > cap]
        return {**{int(j): 0 for j in zero}, **{int(j): 1 for j in one}}


def _matrix(lm: LinearModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row index, column index and coefficient of every nonzero of `lm` (unscaled)."""
    lengths = np.fromiter((len(r[0]) for r in lm.rows), np.int64, len(lm.rows))
    rows = np.repeat(np.arange(len(lm.rows), dtype=np.int64), lengths)
    cols = np.fromiter((v for r in lm.rows for v in r[0]), np.int64, int(lengths.sum()))
    coefs = np.fromiter((c for r in lm.rows for c in r[1]), float, int(lengths.sum()))
    return rows, cols, coefs


def safe_bound(lm: LinearModel, y: np.ndarray) -> DualBound:
    """LB(y) of the module docstring for multipliers `y` (one per row of `lm`), with rounding
    errors bounded. Requires every variable's bounds to be 0 <= x <= upper."""
    assert all(lo == 0 for lo in lm.lower), "variables must have lower bound 0"
    lo = np.array([-math.inf if r[2] is None else r[2] for r in lm.rows], float)
    hi = np.array([math.inf if r[3] is None else r[3] for r in lm.rows], float)
    y = np.where((y > 0) & np.isfinite(lo), y, np.where((y < 0) & np.isfinite(hi), y, 0.0))
    side = np.where(y > 0, lo, np.where(y < 0, hi, 0.0))
    row_terms = y * side
    rows, cols, coefs = _matrix(lm)
    n = len(lm.names)
    cost = np.zeros(n)
    for j, c in lm.objective.items():
        cost[j] += c
    products = coefs * y[rows]
    reduced = cost - np.bincount(cols, products, minlength=n)
    terms = np.bincount(cols, minlength=n) + 1.0
    error = 2 * _ROUNDING * terms * (np.abs(cost) + np.bincount(cols, np.abs(products), n))
    upper = np.asarray(lm.upper, float)
    col_terms = np.minimum(0.0, (reduced - error) * upper)
    total = math.fsum(row_terms) + math.fsum(col_terms)
    slack = (
        _ROUNDING
        * (len(row_terms) + n + 2)
        * (math.fsum(np.abs(row_terms)) + math.fsum(np.abs(col_terms)))
    )
    base = total - slack
    return DualBound(max(0, math.ceil(base - 1e-9)), base, reduced, error)


class GrowingLp:
    """The LP relaxation of a `LinearModel` that grows between solves (variables and rows
    appended, objective coefficients changed), solved with HiGHS's dual simplex, each solve from
    the last one's basis: the rows and columns passed before keep their status, new rows start
    basic and new columns at 0, so a round of row generation costs a few pivots instead of a
    solve from scratch. Scaled as `solver.milp.lp.scaled_lp` scales (`column_scales`,
    `scale_rows`)."""

    def __init__(self, lm: LinearModel) -> None:
        assert all(lo == 0 for lo in lm.lower), "variables must have lower bound 0"
        self.lm = lm
        self.highs = dual_simplex()
        self.col = np.empty(0)
        self.cost = np.empty(0)
        self.row_scale = np.empty(0)

    def _pass_columns(self) -> None:
        lm, have = self.lm, len(self.col)
        count = len(lm.names) - have
        cost = np.zeros(len(lm.names))
        for j, c in lm.objective.items():
            cost[j] = c
        if count:
            upper = np.asarray(lm.upper[have:], float)
            col = column_scales(upper)
            self.col = np.r_[self.col, col]
            empty = np.zeros(count + 1, np.int32)
            self.highs.addCols(
                count, cost[have:] * col, np.zeros(count), upper / col, 0, empty, empty[:0], []
            )
        changed = np.flatnonzero(cost[:have] != self.cost)
        if len(changed):
            self.highs.changeColsCost(
                len(changed), changed.astype(np.int32), cost[changed] * self.col[changed]
            )
        self.cost = cost

    def _pass_rows(self) -> None:
        rows = self.lm.rows[len(self.row_scale) :]
        if not rows:
            return
        scaled = scale_rows(rows, self.col)
        by_row = np.argsort(scaled.row_of, kind="stable")
        starts = np.r_[0, np.cumsum(np.bincount(scaled.row_of, minlength=len(rows)))[:-1]]
        self.highs.addRows(
            len(rows),
            scaled.lo,
            scaled.hi,
            len(by_row),
            starts.astype(np.int32),
            scaled.var_of[by_row].astype(np.int32),
            scaled.coef[by_row],
        )
        self.row_scale = np.r_[self.row_scale, scaled.row_scale]

    def solve(self, deadline: Deadline) -> DualBound | None:
        """The LP of the model as it is now, by `deadline`, its bound certified from the row
        duals (`safe_bound`); None when HiGHS does not finish. The objective must be >= 0 on
        the variables' box (costs are never negative)."""
        self._pass_columns()
        self._pass_rows()
        self.highs.setOptionValue("time_limit", max(0.01, deadline.remaining()))
        self.highs.run()
        if self.highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        solution = self.highs.getSolution()
        y = np.asarray(solution.row_dual, float) / self.row_scale
        bound = safe_bound(self.lm, y)
        return replace(bound, values=np.asarray(solution.col_value, float) * self.col)


def certified_lp_bound(lm: LinearModel, deadline: Deadline) -> DualBound | None:
    """Solve `lm`'s LP relaxation with HiGHS (dual simplex) by `deadline` and certify its bound
    from the row duals (`safe_bound`); None when HiGHS does not finish. Its objective must be
    >= 0 on the variables' box (costs are never negative)."""
    return GrowingLp(lm).solve(deadline)
