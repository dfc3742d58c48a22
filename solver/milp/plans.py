"""Between plans and solutions of the stage model: the values a plan gives every variable (a
complete hint for CP-SAT), and the plan of a solution."""

from __future__ import annotations

from solver.core.graph import Problem
from solver.core.stages import StagePlan
from solver.milp.formulation import frees_after
from solver.milp.model import LinearModel


def hint_values(lm: LinearModel, problem: Problem, plan: StagePlan) -> dict[int, int]:
    """Values of every variable for a plan: R, S, F (from its eager frees), the memory levels U
    and the peak. A complete hint is checked by CP-SAT as a solution at once; an incomplete one
    only guides its search (on the op-level demo graphs CP-SAT found no schedule from a hint
    without the levels)."""
    values: dict[int, int] = {}
    # A value kept where the model has no S (it cannot be read any more) is dropped.
    kept = [plan.kept[t] & lm.keep[t].keys() for t in range(len(lm.keep))]
    for t, stage in enumerate(plan.computed):
        members = set(stage)
        for i, var in lm.compute[t].items():
            values[var] = int(i in members)
        for i, var in lm.keep[t].items():
            values[var] = int(i in kept[t])
        last_use: dict[int, int] = {}
        for k in stage:
            last_use[k] = k
            for p in problem.preds[k]:
                last_use[p] = k
        for (i, k), var in lm.free[t].items():
            values[var] = int(last_use.get(i) == k and k in members and i not in kept[t + 1])
        live = sum(problem.mem[i] for i in kept[t])
        frees = frees_after(lm, t)
        for k, var in lm.levels[t].items():  # (5), step by step
            live += problem.mem[k] * values[lm.compute[t][k]] if k < t else problem.mem[k]
            values[var] = live
            live -= sum(problem.mem[i] * values[f] for i, f in frees.get(k, []))
    if lm.peak is not None:
        values[lm.peak] = max(
            values[level] + problem.transient[k] * values[lm.compute[t][k]]
            for t, stage in enumerate(lm.levels)
            for k, level in stage.items()
        )
    return values


def plan_from_values(lm: LinearModel, n: int, value) -> StagePlan:
    """The plan of a solution; `value(var)` returns a variable's 0/1 value."""
    computed = tuple(
        tuple(sorted(i for i, v in lm.compute[t].items() if i == t or value(v))) for t in range(n)
    )
    kept = tuple(frozenset(i for i, v in lm.keep[t].items() if value(v)) for t in range(n))
    return StagePlan(computed, (*kept, frozenset()))
