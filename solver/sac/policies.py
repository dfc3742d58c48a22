"""The fixed SAC policies a plan is compared with, as `UnionPlan`s of a recorded union:
no checkpointing, full per-block checkpointing, and torchtitan's selective-op policy
(`POLICIES`). Torch-free."""

from __future__ import annotations

from solver.errors import ArgumentError
from solver.sac.memory import SacPlan
from solver.sac.problem import SacBlock
from solver.sac.union import SacUnion, UnionPlan, flatten

POLICIES = ("none", "full", "selective")
"""The fixed policies: no checkpointing; every block checkpointed, saving nothing;
torchtitan's selective op checkpointing (`torchtitan_saved`) in every block."""


def torchtitan_saved(block: SacBlock) -> frozenset[int]:
    """torchtitan's selective-op policy on a recorded block: save SDPA's outputs and every
    second `aten.mm` (the first, third, ...), recompute the rest; ops SAC may not save
    (docs/sac.md) stay recomputed."""
    saved, mm = set(), 0
    for i, op in enumerate(block.ops):
        keep = "scaled_dot_product" in op.name
        if op.name == "aten.mm.default":
            mm += 1
            keep = mm % 2 == 1
        if keep and op.saveable and i <= block.stop:
            saved.add(i)
    return frozenset(saved)


def policy_plan(union: SacUnion, policy: str) -> UnionPlan:
    """The `UnionPlan` of a fixed policy (`POLICIES`) on whole blocks, children unused."""
    if policy not in POLICIES:
        raise ArgumentError(f"unknown SAC policy {policy!r}: one of {', '.join(POLICIES)}")
    blocks = union.blocks.blocks
    if policy == "selective":
        saved = tuple(torchtitan_saved(b) for b in blocks)
    else:
        saved = (frozenset(),) * len(blocks)
    kids = tuple(
        None if s is None else SacPlan((False,) * len(s.children), (frozenset(),) * len(s.children))
        for s in union.splits
    )
    return UnionPlan(SacPlan((policy != "none",) * len(blocks), saved), kids)


def sac_overhead(union: SacUnion, plan: UnionPlan) -> float:
    """Seconds of SAC's dispatch modes in the plan's cost: the overhead of every checkpointed
    region that saves an op (`SacBlock.overhead`)."""
    problem, flat = flatten(union, plan)
    regions = zip(problem.blocks, flat.checkpointed, flat.saved, strict=True)
    return sum(b.overhead for b, c, s in regions if c and s)
