"""A solver-neutral 0/1 linear model with integer coefficients, and a solve's result.

The stage model and its relaxations (`solver.milp.formulation`) and the read-gap cover
(`solver.milp.cover`) are written as `LinearModel`s; CP-SAT (`solver.milp.cpsat`) and HiGHS
(`solver.milp.lp`, `solver.milp.highs_mip`) solve them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.milp.units import integer_floor, safe_floor

Row = tuple[list[int], list[int], int | None, int | None]
"""A linear row: variable indices, integer coefficients, lower and upper bound (None: open)."""


@dataclass
class LinearModel:
    """A 0/1 linear model with integer coefficients; every variable's lower bound is `lower`."""

    names: list[str] = field(default_factory=list)
    lower: list[int] = field(default_factory=list)
    upper: list[int] = field(default_factory=list)
    integral: list[bool] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    objective: dict[int, int] = field(default_factory=dict)
    compute: list[dict[int, int]] = field(default_factory=list)
    keep: list[dict[int, int]] = field(default_factory=list)
    free: list[dict[tuple[int, int], int]] = field(default_factory=list)
    levels: list[dict[int, int]] = field(default_factory=list)
    recompute_cost: dict[int, int] = field(default_factory=dict)
    peak: int | None = None
    first_stage: int = 0

    def var(self, name: str, lower: int, upper: int, integral: bool = True) -> int:
        """Add a variable and return its index."""
        self.names.append(name)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integral.append(integral)
        return len(self.names) - 1

    def row(self, terms: list[tuple[int, int]], lo: int | None, hi: int | None) -> None:
        """Add lo <= sum(coef * var) <= hi, terms as (coef, var) pairs."""
        self.rows.append(([v for _, v in terms], [c for c, _ in terms], lo, hi))

    @property
    def binaries(self) -> list[int]:
        """Indices of the 0/1 decision variables: the integral ones within [0, 1] (the stage
        model's R, S and F, every variable of the cascade cover; not the byte levels U)."""
        return [
            j
            for j, (integral, upper) in enumerate(zip(self.integral, self.upper, strict=True))
            if integral and upper <= 1
        ]


@dataclass(frozen=True)
class ModelResult:
    """A `LinearModel` solved (CP-SAT or HiGHS). status: "OPTIMAL", "FEASIBLE", "INFEASIBLE" or
    "UNKNOWN"; values per variable when a solution was found; objective and bound in the model's
    integer units (bound valid whenever status is not "INFEASIBLE"); `exact`: the bound comes
    from integer arithmetic (CP-SAT), not a floating-point branch and cut (HiGHS)."""

    status: str
    values: list[int] | None
    objective: int | None
    bound: float
    exact: bool = False

    def proven(self, cap: int | None) -> int:
        """The whole units that this solve, of a model whose objective was capped at `cap`
        (None: not capped), proves every solution within the cap to cost at least: cap + 1
        when it found none (a cap is required then), its objective when optimal, else its bound
        (`integer_floor` for an integer engine, `safe_floor` otherwise: NOTE [safe bounds] in
        `solver.milp.units`), never above cap + 1."""
        if self.status == "INFEASIBLE":
            assert cap is not None, "an uncapped infeasible model proves no bound"
            return cap + 1
        if self.status == "OPTIMAL":
            assert self.objective is not None
            proven = self.objective
        else:
            proven = integer_floor(self.bound) if self.exact else safe_floor(self.bound)
        return proven if cap is None else min(proven, cap + 1)
