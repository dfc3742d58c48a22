"""The budgets of the zoo rows of `benchmarks.solving.solver_scale`: a share of the checkpoint-all
peak,
the least feasible peak plus a margin, and per-block checkpoint's memory.

Per-block checkpoint's memory is the peak, in the solver's model, of what `torch.utils.checkpoint`
around each of a model's repeated blocks keeps: a forward node inside a block is dropped after
the forward pass (and recomputed for the backward, `solver.core.stages.plan_from_keep`) unless a
node outside its block reads it in the forward (the block's output, the next block's input, is
saved); every other node is kept. The blocks are named by module path (a node belongs to the
block whose path prefixes its `module` attribute), from the zoo factory's `Bench.blocks`.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

import solver
from solver.heuristics.baselines import block_checkpoint


def block_paths(zoo_name: str) -> list[str]:
    """Module paths of the zoo model's blocks, as graph nodes' `module` attributes spell them
    (builds the model: imports torch)."""
    from benchmarks.zoo import ZOO

    bench = ZOO[zoo_name]()
    names = {id(module): name for name, module in bench.model.named_modules()}
    return [names[id(block)] for block in bench.blocks or ()]


def _block_of(module: str, paths: Sequence[str]) -> str | None:
    for path in paths:
        if module == path or module.startswith(path + "."):
            return path
    return None


def per_block_peak(graph: nx.DiGraph, paths: Sequence[str]) -> int:
    """Peak bytes of per-block checkpointing (`solver.heuristics.baselines.block_checkpoint`)
    of `graph` with blocks `paths`."""
    problem = solver.prepare(graph)
    return block_checkpoint(problem, [_block_of(m, paths) for m in problem.module]).schedule.peak


def least_peak_plus(graph: nx.DiGraph, margin: float, time_limit: float) -> tuple[int, bool]:
    """The least feasible peak found within `time_limit` seconds (`solver.solve`, objective
    "memory") times 1 + margin, in bytes, and whether that peak was proven least."""
    least = solver.solve(graph, objective="memory", time_limit=time_limit)
    return int(least.peak * (1 + margin)), least.status == "OPTIMAL"
