"""Stage plans with offload and their ops (docs/offload.md, "The stage space with offload").

A plan is a `StagePlan` (what each stage computes, what is carried into it) with, per stage, the
values reloaded at its start, and the values offloaded right after their first computation.
`offload_ops` writes its ops in the order the docs state; the simulator
(`solver.core.simulate`) replays them over the link and gives their peak and cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.core.graph import Problem
from solver.core.stages import StagePlan


@dataclass(frozen=True)
class OffloadPlan:
    """stages: computed[t] and kept[t] (the values carried into stage t, not those reloaded);
    reloaded[t]: the values reloaded at the start of stage t (each read in t or kept into
    t + 1); offloaded: the values offloaded right after their first computation. Node
    indices in solver order."""

    stages: StagePlan
    reloaded: tuple[frozenset[int], ...]
    offloaded: frozenset[int]


def offload_ops(problem: Problem, plan: OffloadPlan) -> list[tuple[str, int]]:
    """The plan's ops over node indices: per stage, (1) the frees of carried values the stage
    neither reads nor keeps, but first copies of offloaded values, (2) the reloads, (3) the
    computes with the offload after the stage's node and the frees after each last read, (4)
    the frees of the first copies of offloaded values held to the stage's end. O(total ops *
    in-degree)."""
    ops: list[tuple[str, int]] = []
    computed, kept = plan.stages.computed, plan.stages.kept
    first: set[int] = set()  # values whose live copy is the one from their first computation
    for t, stage in enumerate(computed):
        carried, keep_next = kept[t], kept[t + 1]
        last_read: dict[int, int] = {}
        for k in stage:
            last_read[k] = k
            for p in problem.preds[k]:
                last_read[p] = k
        unread = carried.difference(last_read, keep_next)
        held = {i for i in unread if i in first and i in plan.offloaded}
        ops.extend(("free", i) for i in sorted(unread - held))
        ops.extend(("reload", i) for i in sorted(plan.reloaded[t]))
        for k in stage:
            ops.append(("compute", k))
            if k == t and t in plan.offloaded:
                ops.append(("offload", t))
            for i in (*problem.preds[k], k):
                if last_read.get(i) == k and i not in keep_next:
                    ops.append(("free", i))
                    last_read[i] = -1  # freed once even if i appears twice in the list
        ops.extend(("free", i) for i in sorted(held))
        first = {i for i in (*first, t) if i in keep_next}
    return ops
