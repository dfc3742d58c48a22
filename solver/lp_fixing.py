"""LP relaxation (CLP) of a `LinearModel`, its bound and reduced-cost variable fixing.

For a minimisation LP with optimum z_LP and reduced costs d, every feasible point x satisfies
cost(x) >= z_LP + sum_{d_j > 0} d_j (x_j - lower_j) + sum_{d_j < 0} d_j (x_j - upper_j). So a 0/1
variable at 0 with z_LP + d_j > cutoff is 0 in every solution of cost <= cutoff, and one at 1 with
z_LP - d_j > cutoff is 1 in all of them. With integer costs and an incumbent of cost z, the cutoff
z - 1 keeps every strictly better solution: the fixed model proves z optimal when it is
infeasible. Fixing uses a safety margin so that LP round-off never fixes wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from solver.formulation import LinearModel

_TOLERANCE = 1e-6


@dataclass(frozen=True)
class LpRelaxation:
    """Optimal LP value (model's integer units), primal values and reduced costs per variable."""

    objective: float
    values: list[float]
    reduced_costs: list[float]


def solve_relaxation(
    lm: LinearModel, time_limit: float, backend: str = "CLP"
) -> LpRelaxation | None:
    """Solve the LP relaxation (CLP by default); None when it does not reach optimality in time
    or is infeasible (floating-point infeasibility proves nothing here: CP-SAT then decides).

    Byte counts (up to 1e10) beside 0/1 coefficients make the LP badly scaled (GLOP reported it
    abnormal), so the LP is solved on an equivalent scaling: each non-binary variable divided by
    its upper bound, then each row by its largest coefficient. Reduced costs of the 0/1
    variables are unchanged by this; values are mapped back.
    """
    lp = pywraplp.Solver.CreateSolver(backend)
    lp.SetTimeLimit(max(1, int(time_limit * 1000)))
    col = [max(1.0, float(hi)) if hi > 1 else 1.0 for hi in lm.upper]
    xs = [lp.NumVar(lo / s, hi / s, "") for lo, hi, s in zip(lm.lower, lm.upper, col, strict=True)]
    infinity = lp.infinity()
    for variables, coefs, lo, hi in lm.rows:
        merged: dict[int, float] = {}
        for v, c in zip(variables, coefs, strict=True):
            merged[v] = merged.get(v, 0.0) + c * col[v]
        r = max((abs(c) for c in merged.values()), default=1.0) or 1.0
        row = lp.RowConstraint(
            -infinity if lo is None else lo / r, infinity if hi is None else hi / r, ""
        )
        for v, c in merged.items():
            row.SetCoefficient(xs[v], c / r)
    objective = lp.Objective()
    for v, c in lm.objective.items():
        objective.SetCoefficient(xs[v], c * col[v])
    objective.SetMinimization()
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    return LpRelaxation(
        objective.Value(),
        [x.solution_value() * s for x, s in zip(xs, col, strict=True)],
        [x.reduced_cost() / s for x, s in zip(xs, col, strict=True)],
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
