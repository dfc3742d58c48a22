"""Heuristic schedules the exact solver must beat, all under the same semantics and checker.

Each baseline is a family of checkpoint policies: a set of nodes kept between stages (see
`solver.core.stages.plan_from_keep`); everything else is dropped after use and recomputed when
needed. On a forward+backward graph only forward nodes are candidates for dropping (backward nodes
are kept until their last use, as Checkmate's baselines do); on a graph without phases every node
is. For a budget, a baseline returns the cheapest member of its family that fits, or None. Each
family stops adding members when its `deadline` passes and returns those it has.

- `checkpoint_all`: keep everything; no recomputation. Its peak defines "100%" of a budget.
- `sqrt_segments`: Chen et al.'s sqrt(n): keep every round(sqrt(c))-th of the c candidates.
- `every_k`: keep every k-th candidate, best k.
- `chen_greedy`: Chen et al.'s greedy: walk the candidates, keep one whenever the bytes dropped
  since the last kept one exceed b; best b over a sweep.
- `ap_sqrt_segments`, `ap_greedy`: the same two with candidates restricted to the articulation
  points of the (forward) graph, Checkmate's generalisation to non-linear graphs.
- `bytes_per_cost`: drop candidates in order of bytes freed per unit of recompute cost (cheap per
  byte first); best prefix.
- `every_k_recompute_each_use`: every k-th candidate kept, everything else recomputed at each use
  and never kept: low peaks at a high cost, the warm start for tight budgets.
- `module_blocks`: ``torch.utils.checkpoint`` around each module of a captured graph (`module`
  node attribute) at one depth of its path, over the first k blocks: per-block checkpointing
  as users write it, so the exact search starts no worse than it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import networkx as nx

from solver.core.graph import Problem
from solver.core.stages import Member, plan_from_keep, plan_to_ops
from solver.deadline import NEVER, Deadline

SWEEP_POINTS = 48
"""How many members a swept family (every_k, greedy budgets, ranking prefixes) evaluates at most."""

T = TypeVar("T")

Family = Callable[[Problem, Deadline], list[Member]]
"""A policy family: its members on a problem, as many as `deadline` allows."""


def candidates(problem: Problem) -> list[int]:
    """Nodes a baseline may drop: forward nodes of a training graph, else all nodes."""
    return [i for i in range(problem.n) if not problem.backward[i]]


def articulation_candidates(problem: Problem) -> list[int]:
    """Candidates that are articulation points of the undirected candidate subgraph."""
    cands = candidates(problem)
    sub = nx.Graph()
    sub.add_nodes_from(cands)
    cand_set = set(cands)
    sub.add_edges_from((p, v) for v in cands for p in problem.preds[v] if p in cand_set)
    return sorted(nx.articulation_points(sub))


def _member(
    problem: Problem, param: str, dropped_from: set[int], retain_recomputed: bool = True
) -> Member:
    keep = [i for i in range(problem.n) if i not in dropped_from]
    plan = plan_from_keep(problem, keep, retain_recomputed)
    return Member(param, plan, plan_to_ops(problem, plan))


def _keep_every(
    problem: Problem, cands: Sequence[int], k: int, retain_recomputed: bool = True
) -> Member:
    kept = set(cands[k - 1 :: k])
    return _member(problem, f"k={k}", set(cands) - kept, retain_recomputed)


def _sampled(values: Sequence[int], limit: int = SWEEP_POINTS) -> list[int]:
    if len(values) <= limit:
        return list(values)
    step = (len(values) - 1) / (limit - 1)
    return sorted({values[round(j * step)] for j in range(limit)})


def _until(deadline: Deadline, make: Callable[[T], Member], params: Iterable[T]) -> list[Member]:
    """make(p) for each of `params` while twice the slowest member so far would still end before
    `deadline` (members grow costlier along some sweeps)."""
    out: list[Member] = []
    slowest = 0.0
    for param in params:
        began = time.perf_counter()
        if not deadline.leaves(2 * slowest):
            break
        out.append(make(param))
        slowest = max(slowest, time.perf_counter() - began)
    return out


def checkpoint_all(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Keep every value until its last use."""
    return [_member(problem, "-", set())]


def _sqrt(problem: Problem, cands: Sequence[int]) -> list[Member]:
    if not cands:
        return checkpoint_all(problem)
    return [_keep_every(problem, cands, max(1, round(math.sqrt(len(cands)))))]


def sqrt_segments(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Chen's sqrt(n): segments of about sqrt(c) candidates, keep each segment's last node."""
    return _sqrt(problem, candidates(problem))


def ap_sqrt_segments(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """sqrt(n) segments over articulation points only."""
    return _sqrt(problem, articulation_candidates(problem))


def every_k(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Keep every k-th candidate, for k over 1..c (sampled)."""
    cands = candidates(problem)
    ks = _sampled(range(1, len(cands) + 1))
    return _until(deadline, lambda k: _keep_every(problem, cands, k), ks)


RECOMPUTE_EACH_USE_POINTS = 12
"""Members of `every_k_recompute_each_use` (each costs a full recomputation sweep)."""

RECOMPUTE_EACH_USE_MAX_NODES = 400
"""Largest graph `every_k_recompute_each_use` runs on: its schedules have O(n^2) ops (at 500
nodes its members take longer than a default solve)."""


def every_k_recompute_each_use(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Keep every k-th candidate and recompute every other value at each use, never keeping a
    recomputed value: the least-memory end of the checkpoint policies (quadratic cost). Empty
    on graphs of more than RECOMPUTE_EACH_USE_MAX_NODES nodes."""
    if problem.n > RECOMPUTE_EACH_USE_MAX_NODES:
        return []
    cands = candidates(problem)
    ks = _sampled(range(1, len(cands) + 1), RECOMPUTE_EACH_USE_POINTS)
    return _until(deadline, lambda k: _keep_every(problem, cands, k, False), ks)


def _greedy(problem: Problem, cands: Sequence[int], deadline: Deadline) -> list[Member]:
    if not cands:
        return checkpoint_all(problem)
    sizes = [problem.mem[v] for v in cands]
    low, high = max(1, min(sizes)), max(1, sum(sizes))
    budgets = sorted(
        {round(low * (high / low) ** (j / (SWEEP_POINTS - 1))) for j in range(SWEEP_POINTS)}
    )
    kept_sets: dict[frozenset[int], int] = {}  # each distinct kept set, with its first b
    for b in budgets:
        kept, dropped_bytes = set(), 0
        for v in cands:
            dropped_bytes += problem.mem[v]
            if dropped_bytes > b:
                kept.add(v)
                dropped_bytes = 0
        kept_sets.setdefault(frozenset(kept), b)
    return _until(
        deadline,
        lambda item: _member(problem, f"b={item[1]}", set(cands) - item[0]),
        kept_sets.items(),
    )


def chen_greedy(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Chen's greedy over all candidates, sweeping the segment budget b (bytes)."""
    return _greedy(problem, candidates(problem), deadline)


def ap_greedy(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Chen's greedy over articulation points only."""
    return _greedy(problem, articulation_candidates(problem), deadline)


def bytes_per_cost(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Drop candidates with the most bytes per unit of recompute cost first; sweep the prefix."""
    cands = candidates(problem)
    ratio = {
        v: problem.mem[v] / problem.cost[v] if problem.cost[v] > 0 else math.inf for v in cands
    }
    ranked = sorted(cands, key=lambda v: (-ratio[v], v))
    prefixes = _sampled(range(len(ranked) + 1))
    return _until(deadline, lambda m: _member(problem, f"drop={m}", set(ranked[:m])), prefixes)


def block_checkpoint(problem: Problem, block: Sequence[str | None], param: str = "-") -> Member:
    """Checkpointing around blocks: ``block[v]`` names node v's block (None: in no block). A
    forward node in a block is dropped after use and recomputed for the backward unless a
    forward node outside its block reads it (the block's output is saved); nodes in no block
    and backward nodes are kept, as ``torch.utils.checkpoint`` (non-reentrant) around each
    block runs them."""
    backward = problem.backward
    dropped = {
        v
        for v in candidates(problem)
        if block[v] is not None
        and all(backward[w] or block[w] == block[v] for w in problem.succs[v])
    }
    return _member(problem, param, dropped)


MODULE_BLOCK_POINTS = 12
"""Members of `module_blocks` per module depth (how many leading blocks are checkpointed)."""


def module_blocks(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """Per-block checkpointing over the modules of a captured graph: at each depth d of the
    `module` paths, a node's block is its path cut to d parts (no block when the path is
    shorter), and the first k blocks in graph order are checkpointed (`block_checkpoint`): every
    block at each depth first, then k swept down (the last blocks' activations are the first
    the backward frees, so leaving them whole saves recomputation at little memory). Empty
    where the graph has no module paths."""
    cands = candidates(problem)
    cuts: dict[int, list[str | None]] = {}
    order: dict[int, list[str]] = {}  # each depth's blocks, in graph order
    for d in range(1, max((m.count(".") + 1 for m in problem.module if m), default=0) + 1):
        cuts[d] = [
            ".".join(m.split(".")[:d]) if m.count(".") >= d - 1 and m else None
            for m in problem.module
        ]
        order[d] = list(dict.fromkeys(cuts[d][v] for v in cands if cuts[d][v] is not None))
    params = [(d, len(blocks)) for d, blocks in order.items() if blocks]
    params += [
        (d, k)
        for d, blocks in order.items()
        for k in _sampled(range(1, len(blocks)), MODULE_BLOCK_POINTS)[::-1]
    ]

    def make(param: tuple[int, int]) -> Member:
        d, k = param
        first = set(order[d][:k])
        block = [b if b in first else None for b in cuts[d]]
        return block_checkpoint(problem, block, f"depth={d},k={k}")

    return _until(deadline, make, params)


BASELINES: dict[str, Family] = {
    "checkpoint_all": checkpoint_all,
    "module_blocks": module_blocks,
    "sqrt_segments": sqrt_segments,
    "ap_sqrt_segments": ap_sqrt_segments,
    "every_k": every_k,
    "chen_greedy": chen_greedy,
    "ap_greedy": ap_greedy,
    "bytes_per_cost": bytes_per_cost,
    "every_k_recompute_each_use": every_k_recompute_each_use,
}
"""Every checkpoint-policy family by name, in the order tables list them and warm starts
evaluate them (the policy part of `solver.heuristics.registry.HEURISTICS`): cheap families
with the most to offer first."""
