"""Schedules rounded from a fractional keep (Checkmate's two-phase LP rounding), for any DAG.

The LP relaxation of `solver.milp.formulation` says, per stage boundary t, how much of each value
S[t,i] in [0, 1] to keep. Rounding keeps the values with S[t,i] >= theta, and
`solver.core.stages.plan_from_kept_sets` completes the plan: each stage computes its node and,
recursively, every input that is not live, and values no later stage reads are dropped. Every
threshold gives a valid plan; the ones whose peak fits the budget are candidates for the exact
solver's incumbent. Unlike the baselines this needs no forward/backward structure, so it also serves
graphs without phases.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from solver.core.graph import Problem
from solver.core.stages import Member, plan_from_kept_sets, plan_to_ops
from solver.deadline import NEVER, Deadline

THRESHOLDS = tuple(j / 20 for j in range(1, 20))
"""Rounding thresholds theta tried, 0.05 .. 0.95."""


def rounded_members(
    problem: Problem, keep_fraction: Sequence[dict[int, float]], deadline: Deadline = NEVER
) -> list[Member]:
    """One schedule per threshold of `THRESHOLDS` (while twice the slowest so far would end
    before `deadline`); keep_fraction[t][i] is S[t,i] in [0, 1]."""
    members = []
    seen: set[tuple[frozenset[int], ...]] = set()
    slowest = 0.0
    for theta in THRESHOLDS:
        began = time.perf_counter()
        if not deadline.leaves(2 * slowest):
            break
        wanted = [frozenset(i for i, x in stage.items() if x >= theta) for stage in keep_fraction]
        plan = plan_from_kept_sets(problem, wanted)
        if plan.kept not in seen:
            seen.add(plan.kept)
            members.append(Member(f"theta={theta:g}", plan, plan_to_ops(problem, plan)))
        slowest = max(slowest, time.perf_counter() - began)
    return members
