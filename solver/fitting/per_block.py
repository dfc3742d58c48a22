"""Per-block checkpointing's least peak within a compute cap, the baseline a fit is compared
with (`per_block_peak`)."""

from __future__ import annotations

import networkx as nx

from solver.core.budget import checkpoint_all_peak, parse_compute_budget
from solver.core.graph import prepare
from solver.heuristics.baselines import block_checkpoint


def per_block_peak(graph: nx.DiGraph, cap: str | None) -> int | None:
    """The least peak (bytes) of checkpointing every module block of one depth, over the depths
    whose cost is within the compute cap (`cap`: text like "1.3x", None: unlimited); None where
    no depth is."""
    problem = prepare(graph)
    limit = None if cap is None else parse_compute_budget(cap, problem)
    modules = problem.module
    depth = max((m.count(".") + 1 for m in modules if m), default=0)
    peaks = []
    for d in range(1, depth + 1):
        schedule = block_checkpoint(problem, [_cut(m, d) for m in modules]).schedule
        if limit is None or schedule.cost <= limit * (1 + 1e-12):
            peaks.append(schedule.peak)
    if depth == 0:  # no module blocks: nothing is checkpointed, within every cap
        return checkpoint_all_peak(problem)
    return min(peaks, default=None)


def _cut(module: str, depth: int) -> str | None:
    """The module path cut to `depth` parts; None where it is shorter (no block)."""
    if not module or module.count(".") < depth - 1:
        return None
    return ".".join(module.split(".")[:depth])
