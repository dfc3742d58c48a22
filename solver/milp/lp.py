"""LP relaxation (HiGHS) of a `LinearModel`, its bound and reduced-cost variable fixing.

For a minimisation LP with optimum z_LP and reduced costs d, every feasible point x satisfies
cost(x) >= z_LP + sum_{d_j > 0} d_j (x_j - lower_j) + sum_{d_j < 0} d_j (x_j - upper_j). So a 0/1
variable at 0 with z_LP + d_j > cutoff is 0 in every solution of cost <= cutoff, and one at 1 with
z_LP - d_j > cutoff is 1 in all of them. With integer costs and an incumbent of cost z, the cutoff
z - 1 keeps every strictly better solution: the fixed model proves z optimal when it is
infeasible. Fixing uses a safety margin so that LP round-off never fixes wrongly.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import highspy
import numpy as np

from solver.deadline import Deadline
from solver.milp.model import LinearModel, Row

_TOLERANCE = 1e-6


@dataclass(frozen=True)
class LpRelaxation:
    """Optimal LP value (model's integer units), primal values and reduced costs per variable,
    and the scaled model it was solved on (for `solver.mip` to reuse; None where unknown)."""

    objective: float
    values: list[float]
    reduced_costs: list[float]
    scaled: ScaledLp | None = None


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
    Its last row is the objective, free here; `solver.mip` bounds it by a cap."""

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


def solve_relaxation(lm: LinearModel, deadline: Deadline) -> LpRelaxation | None:
    """Solve the LP relaxation with HiGHS's dual simplex; None when it does not reach optimality
    by `deadline` (building HiGHS's model included) or is infeasible (floating-point
    infeasibility proves nothing here: the MIP decides). Its objective is a floating-point
    bound: read it through `solver.milp.units.safe_floor` (NOTE [safe bounds]).

    It is solved on `scaled_lp`'s scaling: reduced costs of the 0/1 variables are unchanged by
    it; values are mapped back. Devex pricing without presolve was the fastest setting on the
    published graphs (docs/solver.md, "LP relaxation", compares the others); OR-Tools' own HiGHS
    interface returns zero reduced costs, so HiGHS is called through highspy.
    """
    scaled = scaled_lp(lm)
    if deadline.passed():
        return None
    lp, col = scaled.lp, scaled.col
    highs = dual_simplex()
    highs.setOptionValue("time_limit", max(0.01, deadline.remaining()))
    # devex: steepest edge was 3x slower here
    highs.setOptionValue("simplex_dual_edge_weight_strategy", 1)
    highs.passModel(lp)
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = highs.getSolution()
    return LpRelaxation(
        highs.getInfo().objective_function_value,
        (np.asarray(solution.col_value) * col).tolist(),
        (np.asarray(solution.col_dual) / col).tolist(),
        scaled,
    )


def reduced_cost_fixings(lm: LinearModel, lp: LpRelaxation, cutoff: float) -> dict[int, int]:
    """0/1 variables whose value is the same in every solution of objective <= cutoff."""
    margin = _TOLERANCE * max(1.0, abs(cutoff))
    fixed: dict[int, int] = {}
    for j in lm.binaries:
        x, d = lp.values[j], lp.reduced_costs[j]
        if x <= _TOLERANCE and d > 0 and lp.objective + d > cutoff + margin:
            fixed[j] = 0
        elif x >= 1 - _TOLERANCE and d < 0 and lp.objective - d > cutoff + margin:
            fixed[j] = 1
    return fixed
