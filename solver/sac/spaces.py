"""The least-recompute SAC plan over several region spaces of one model (its blocks as regions;
each block's children as regions): each space is solved exactly (`solve_sac`) and the cheapest
plan returned, certified over the union of the spaces.

A space is one `SacProblem`: every plan in it chooses regions among that space's modules only.
The union is the set of plans of any one space; a plan mixing granularities per block (one
block whole, another split into its children) is in neither space and not searched.

`status` is "OPTIMAL" when every space's solve is proven (or the space is proven infeasible at
the budget): then no plan of any space costs less. `bound` is the least of the spaces' proven
bounds, so `gap` is certified over the union. `"min"` is the least predicted peak of any plan in
any space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError
from solver.sac.problem import SacProblem
from solver.sac.solve import SacSolution, least_peak, solve_sac


@dataclass(frozen=True)
class SpaceChoice:
    """The chosen space (`space`: index into the problems) and its plan, with `status`, `bound`
    and `gap` over the union of the spaces; `costs`: each space's cost at the budget (inf where
    the space is proven infeasible there)."""

    space: int
    solution: SacSolution
    costs: tuple[float, ...]


def solve_spaces(
    problems: Sequence[SacProblem], budget: int | str, deadline: Deadline
) -> SpaceChoice:
    """The plan of least recompute seconds with predicted peak at most `budget` bytes over the
    union of the spaces (`"min"`: at the least peak of any space). InfeasibleBudgetError (with
    the least peak of any space) when no space fits."""
    if not problems:
        raise ValueError("no region space to solve")
    proven_least = True
    if budget == "min":
        leasts = []
        for k, problem in enumerate(problems):
            _, least, proven = least_peak(problem, deadline.share(0.5 / (len(problems) - k)))
            leasts.append(least)
            proven_least = proven_least and proven
        budget = min(leasts)
    solutions: list[SacSolution | None] = []
    errors: list[InfeasibleBudgetError] = []
    for k, problem in enumerate(problems):
        try:
            solutions.append(solve_sac(problem, budget, deadline.share(1 / (len(problems) - k))))
        except InfeasibleBudgetError as e:
            solutions.append(None)
            errors.append(e)
    found = [(s.cost, k) for k, s in enumerate(solutions) if s is not None]
    if not found:
        least = [e.minimum_bytes for e in errors]
        proven = all(x is not None for x in least)
        found_least = min(math.inf if x is None else x for x in least)
        raise InfeasibleBudgetError(
            f"no SAC plan fits {budget} bytes in any region space: the least predicted peak in "
            f"SAC's space is {found_least} bytes"
            + ("; give at least that" if proven else " (not proven least)"),
            min(least) if proven else None,
            int(budget) + 1,
        )
    _, best = min(found)
    chosen = solutions[best]
    optimal = proven_least and all(s is None or s.status == "OPTIMAL" for s in solutions)
    bound = min(min(s.bound for s in solutions if s is not None), chosen.cost)
    gap = 0.0 if optimal or chosen.cost <= 0 else (chosen.cost - bound) / chosen.cost
    status = "OPTIMAL" if optimal else "FEASIBLE"
    costs = tuple(math.inf if s is None else s.cost for s in solutions)
    return SpaceChoice(best, replace(chosen, status=status, bound=bound, gap=gap), costs)
