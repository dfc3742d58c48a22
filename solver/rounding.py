"""Schedules rounded from a fractional keep (Checkmate's two-phase LP rounding), for any DAG.

The LP relaxation of `solver.formulation` says, per stage boundary t, how much of each value
S[t,i] in [0, 1] to keep. Rounding keeps the values with S[t,i] >= theta; `plan_from_kept_sets`
then completes the plan: each stage computes its node and, recursively, every input that is not
live, and values no later stage reads are dropped. Every threshold gives a valid plan; the ones
whose peak fits the budget are candidates for the exact solver's incumbent. Unlike the baselines
this needs no forward/backward structure, so it also serves graphs without phases.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from solver.baselines import Member
from solver.graph import Problem
from solver.stages import StagePlan, plan_to_ops

THRESHOLDS = tuple(j / 20 for j in range(1, 20))
"""Rounding thresholds theta tried, 0.05 .. 0.95."""


def _complete(problem: Problem, wanted: Sequence[frozenset[int]]) -> StagePlan:
    """Stage t computes t and whatever (recursively) is missing for t and for wanted[t + 1]."""
    n = problem.n
    computed: list[tuple[int, ...]] = []
    kept: list[frozenset[int]] = [frozenset()]
    for t in range(n):
        live = kept[t]
        targets = [t, *(i for i in wanted[t + 1] if i not in live and i <= t)]
        stage: set[int] = set()
        stack = [v for v in targets if v not in stage]
        while stack:
            v = stack.pop()
            if v in stage:
                continue
            stage.add(v)
            stack.extend(p for p in problem.preds[v] if p not in live and p not in stage)
        computed.append(tuple(sorted(stage)))
        kept.append(frozenset(i for i in wanted[t + 1] if i <= t) if t + 1 < n else frozenset())
    return StagePlan(tuple(computed), tuple(kept))


def _drop_unread(problem: Problem, plan: StagePlan) -> list[frozenset[int]]:
    """The kept sets without values that no later stage reads before they are dropped."""
    kept = list(plan.kept)
    for t in range(problem.n - 1, 0, -1):
        read = {p for k in plan.computed[t] for p in problem.preds[k]}
        kept[t] = frozenset(i for i in kept[t] if i in kept[t + 1] or i in read)
    return kept


def plan_from_kept_sets(problem: Problem, wanted: Sequence[Iterable[int]]) -> StagePlan:
    """A valid plan keeping (at most) wanted[t] when stage t begins, t = 0..n; every value a
    stage needs that is not kept is recomputed in it."""
    first = _complete(problem, [frozenset(w) for w in wanted])
    return _complete(problem, _drop_unread(problem, first))


def rounded_members(problem: Problem, keep_fraction: Sequence[dict[int, float]]) -> list[Member]:
    """One schedule per threshold of `THRESHOLDS`; keep_fraction[t][i] is S[t,i] in [0, 1]."""
    members = []
    seen: set[tuple[frozenset[int], ...]] = set()
    for theta in THRESHOLDS:
        wanted = [frozenset(i for i, x in stage.items() if x >= theta) for stage in keep_fraction]
        plan = plan_from_kept_sets(problem, wanted)
        if plan.kept in seen:
            continue
        seen.add(plan.kept)
        members.append(Member(f"theta={theta:g}", plan, plan_to_ops(problem, plan)))
    return members
