r"""The LP relaxation of a `LinearModel` (HiGHS's dual simplex), its certified bound and the 0/1
fixings that bound implies: the one LP path of the solver.

For min c^T x s.t. lo <= A x <= hi, 0 <= x <= upper, ANY row multipliers y give

    c^T x = y^T A x + d^T x >= sum_r min(y_r lo_r, y_r hi_r) + sum_j d_j x_j,   d = c - A^T y,

where min(y_r lo_r, y_r hi_r) is y_r lo_r for y_r >= 0 and y_r hi_r otherwise (a multiplier on an
open side is dropped, as 0 is a multiplier too). So LB(y) = sum_r (that) + sum_j min(0, d_j upper_j)
bounds every feasible x, and for a 0/1 variable x_j,

    c^T x >= LB(y) + d_j x_j          (d_j > 0)        c^T x >= LB(y) + |d_j| (1 - x_j)  (d_j < 0)

so a solution of cost <= cap has x_j = 0 when LB(y) + d_j > cap (x_j = 1 when LB(y) + |d_j| >
cap): reduced-cost fixing. HiGHS's optimal duals make LB(y) the LP optimum; the arithmetic is
redone here in floating point with every rounding error bounded (relative 2^-52 per operation,
summed over each sum's terms), so the bound and the fixings hold whatever HiGHS's tolerances
were: this is the Neumaier-Shcherbina safe bound. With integer costs and an incumbent of cost z,
fixing at the cap z - 1 keeps every strictly better solution: the fixed model proves z optimal
when it is infeasible.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from dataclasses import dataclass, replace

import highspy
import numpy as np

from solver.deadline import Deadline
from solver.milp.model import LinearModel, Row

_ROUNDING = 2.0**-52
"""Relative error of one float64 operation, doubled for safety."""


def column_scales(upper: np.ndarray) -> np.ndarray:
    """The scale of each column: its upper bound where above 1 (byte levels), else 1 (0/1)."""
    return np.where(upper > 1, upper, 1.0)


@dataclass(frozen=True)
class ScaledRows:
    """Rows with column j scaled by col[j] and each row by its largest coefficient: their
    nonzeros column by column (row index, variable, value; a variable twice in a row summed),
    the scaled row bounds (HiGHS's infinity where open) and the row scales."""

    row_of: np.ndarray
    var_of: np.ndarray
    coef: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    row_scale: np.ndarray


def scale_rows(rows: list[Row], col: np.ndarray) -> ScaledRows:
    """`rows` scaled (`ScaledRows`) for column scales `col` (`column_scales`)."""
    count = len(rows)
    lengths = np.fromiter((len(r[0]) for r in rows), np.int64, count)
    nnz = int(lengths.sum())
    row_of = np.repeat(np.arange(count, dtype=np.int64), lengths)
    var_of = np.fromiter((v for r in rows for v in r[0]), np.int64, nnz)
    coef = np.fromiter((c for r in rows for c in r[1]), float, nnz) * col[var_of]
    key = var_of * count + row_of  # column-major; a variable twice in a row is summed
    order = np.argsort(key, kind="stable")
    key, coef = key[order], coef[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    coef, key = np.add.reduceat(coef, starts), key[starts]
    nonzero = coef != 0
    coef, key = coef[nonzero], key[nonzero]
    row_of, var_of = key % count, key // count
    row_scale = np.zeros(count)
    np.maximum.at(row_scale, row_of, np.abs(coef))
    row_scale[row_scale == 0] = 1.0
    inf = highspy.kHighsInf
    lo = np.fromiter((-inf if r[2] is None else r[2] for r in rows), float, count) / row_scale
    hi = np.fromiter((inf if r[3] is None else r[3] for r in rows), float, count) / row_scale
    return ScaledRows(row_of, var_of, coef / row_scale[row_of], lo, hi, row_scale)


@dataclass(frozen=True)
class ScaledLp:
    """A `LinearModel` as a HiGHS LP (`scaled_lp`): the model, and the column and row scales.
    Its last row is the objective, free here; `solver.milp.highs_mip` bounds it by a cap."""

    lp: highspy.HighsLp
    col: np.ndarray
    row_scale: np.ndarray


def scaled_lp(lm: LinearModel) -> ScaledLp:
    """The model, plus a free row holding the objective, as a HiGHS LP on an equivalent scaling.

    Byte counts (up to 1e10) beside 0/1 coefficients make the model badly scaled, so each
    non-binary variable is divided by its upper bound (column j of the HiGHS model is variable j
    divided by col[j]), then each row by its largest coefficient (row r divided by row[r]). The
    0/1 variables, and with them the objective (recompute costs of R variables), keep their
    units. The free row changes nothing in the LP (its dual is 0); it is there so that the
    branch and cut can take the same model without building it again.
    """
    upper = np.asarray(lm.upper, float)
    col = column_scales(upper)
    objective = list(lm.objective)
    rows = [*lm.rows, (objective, [lm.objective[v] for v in objective], None, None)]
    scaled = scale_rows(rows, col)
    starts = np.r_[0, np.cumsum(np.bincount(scaled.var_of, minlength=len(lm.names)))]
    cost = np.zeros(len(lm.names))
    for v, c in lm.objective.items():
        cost[v] += c
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(lm.names), len(rows)
    lp.col_cost_ = cost * col
    lp.col_lower_ = np.asarray(lm.lower, float) / col
    lp.col_upper_ = upper / col
    lp.row_lower_, lp.row_upper_ = scaled.lo, scaled.hi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_ = starts, scaled.row_of
    lp.a_matrix_.value_ = scaled.coef
    return ScaledLp(lp, col, scaled.row_scale)


_FIRST_HIGHS = threading.Lock()
_banner_written = False


def quiet_highs() -> highspy.Highs:
    """A Highs instance. The first one in a process writes a banner to the C-level stdout, which
    would end up in the middle of our own output (`remat solve` tables and JSON): it goes to
    /dev/null. Only that first one touches stdout (under a lock: the exact solver makes Highs
    instances on two threads)."""
    global _banner_written
    with _FIRST_HIGHS:
        if _banner_written:
            return highspy.Highs()
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                highs = highspy.Highs()
                _banner_written = True
                return highs
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def dual_simplex() -> highspy.Highs:
    """A quiet Highs instance set to HiGHS's dual simplex without presolve (which removed ~7%
    of the stage model's rows and cost more time than it saved)."""
    highs = quiet_highs()
    for option, value in (
        ("output_flag", False),
        ("solver", "simplex"),
        ("simplex_strategy", 1),
        ("presolve", "off"),
    ):
        highs.setOptionValue(option, value)
    return highs


@dataclass(frozen=True)
class DualBound:
    """bound: a certified lower bound on the model's objective (a whole number: the objective
    has integer coefficients on integer variables); base: the real-valued LB(y) it rounds up;
    reduced: d_j and its error bound per variable, and which variables are 0/1 with the box
    [0, 1] (`fixings`); values: the LP's primal solution
    where it came from one (None from `safe_bound` alone); scaled: the HiGHS model it was solved
    on, for `solver.milp.highs_mip` to reuse (`solve_relaxation`; None elsewhere)."""

    bound: int
    base: float
    reduced: np.ndarray
    error: np.ndarray
    fixable: np.ndarray
    values: np.ndarray | None = None
    scaled: ScaledLp | None = None

    def fixings(self, cap: int) -> dict[int, int]:
        """The 0/1 variables whose value is the same in every solution of objective <= cap."""
        d, e = self.reduced, self.error
        zero = np.flatnonzero(self.fixable & (d - e > 0))
        zero = zero[self.base + d[zero] - e[zero] > cap]
        one = np.flatnonzero(self.fixable & (d + e < 0))
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
    errors bounded. Requires every variable's bounds to be 0 <= lower <= x <= upper (a
    variable's term is then d_j lower_j where d_j >= 0, else d_j upper_j)."""
    assert all(lo >= 0 for lo in lm.lower), "variables must have lower bounds >= 0"
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
    lower, upper = np.asarray(lm.lower, float), np.asarray(lm.upper, float)
    low = reduced - error  # d_j is at least this
    col_terms = np.where(low >= 0, low * lower, low * upper)
    total = math.fsum(row_terms) + math.fsum(col_terms)
    slack = (
        _ROUNDING
        * (len(row_terms) + n + 2)
        * (math.fsum(np.abs(row_terms)) + math.fsum(np.abs(col_terms)))
    )
    base = total - slack
    fixable = np.asarray(lm.integral, bool) & (lower == 0) & (upper == 1)
    return DualBound(max(0, math.ceil(base - 1e-9)), base, reduced, error, fixable)


class GrowingLp:
    """The LP relaxation of a `LinearModel` that grows between solves (variables and rows
    appended, objective coefficients changed), solved with HiGHS's dual simplex, each solve from
    the last one's basis: the rows and columns passed before keep their status, new rows start
    basic and new columns at 0, so a round of row generation costs a few pivots instead of a
    solve from scratch. Scaled as `solver.milp.lp.scaled_lp` scales (`column_scales`,
    `scale_rows`)."""

    def __init__(self, lm: LinearModel) -> None:
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
            lower = np.asarray(lm.lower[have:], float)
            upper = np.asarray(lm.upper[have:], float)
            col = column_scales(upper)
            self.col = np.r_[self.col, col]
            empty = np.zeros(count + 1, np.int32)
            self.highs.addCols(
                count, cost[have:] * col, lower / col, upper / col, 0, empty, empty[:0], []
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
        self.highs.HandleUserInterrupt = True  # `cancelSolve` ends the run on a stop (Ctrl-C)
        with deadline.on_stop(self.highs.cancelSolve):
            self.highs.run()
        if self.highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        solution = self.highs.getSolution()
        y = np.asarray(solution.row_dual, float) / self.row_scale
        bound = safe_bound(self.lm, y)
        return replace(bound, values=np.asarray(solution.col_value, float) * self.col)


def solve_relaxation(lm: LinearModel, deadline: Deadline) -> DualBound | None:
    """Solve `lm`'s LP relaxation with HiGHS's dual simplex by `deadline` (building HiGHS's
    model included) and certify its bound from the row duals (`safe_bound`); None when HiGHS
    does not reach optimality (floating-point infeasibility proves nothing here: the MIP
    decides). Its objective must be >= 0 on the variables' box (costs are never negative).

    It is solved on `scaled_lp`'s scaling, which the result keeps (`DualBound.scaled`) for the
    branch and cut. Devex pricing without presolve was the fastest setting on the published
    graphs (docs/solver.md, "LP relaxation"); OR-Tools' own HiGHS interface returns no duals, so
    HiGHS is called through highspy.
    """
    scaled = scaled_lp(lm)
    if deadline.passed():
        return None
    highs = dual_simplex()
    highs.setOptionValue("time_limit", max(0.01, deadline.remaining()))
    # devex: steepest edge was 3x slower here
    highs.setOptionValue("simplex_dual_edge_weight_strategy", 1)
    highs.passModel(scaled.lp)
    highs.HandleUserInterrupt = True  # `cancelSolve` ends the run on a stop (Ctrl-C)
    with deadline.on_stop(highs.cancelSolve):
        highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = highs.getSolution()
    rows = len(lm.rows)  # the last row of the scaled model is the free objective row
    y = np.asarray(solution.row_dual, float)[:rows] / scaled.row_scale[:rows]
    values = np.asarray(solution.col_value, float) * scaled.col
    return replace(safe_bound(lm, y), values=values, scaled=scaled)
