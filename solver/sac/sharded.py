"""SAC plans under FSDP2 (`fully_shard` per block and at the root): torch-free, bytes.

The SAC problem is the single-process step on one rank's batch (docs/sac.md); FSDP2 adds its
buffers at moments of that step (`solver.target.fsdp`). Two things join them:

- `shifted(union, memory)`: the problem with each window of the step raised by the most FSDP
  bytes of that window (the blocks' forward and backward windows, the stretches before, between
  and after them, the root's backward after block 0's; a split block's children and inner
  stretches by their block's). Every term
  of the SAC memory model then bounds the rank's bytes above its resident ones while that term
  holds, so a plan whose shifted peak fits `device memory - resident` fits the device. Per
  window the FSDP maximum meets each of its activation levels: an upper bound.
- `plan_windows(union, plan)`: the plan's single-process windows per block (`StepWindows`), the
  levels `solver.target.predict_peak` pairs with FSDP's moments: the per-rank peak of the plan
  (`rank_peak`), at most the shifted one.

A split block's inner stretches are in the order `solver.sac.windows.cut_windows` cuts them:
the forward's (before its first child, after each child) and then the backward's (before its
last child's backward), one.
"""

from __future__ import annotations

from dataclasses import replace

from solver.sac.memory import plan_terms, savings
from solver.sac.problem import SacBlock, Segment
from solver.sac.union import SacSplit, SacUnion, UnionPlan, flatten
from solver.target.fsdp import FsdpMemory
from solver.target.rank_peak import RankPeak, StepWindows, predict_peak


def _offsets(memory: FsdpMemory, n: int) -> tuple[list[int], list[int], list[int]]:
    """The most FSDP bytes per block's forward and backward window (block 0's backward with the
    root's), and per stretch outside the blocks (by `held`: before block 0, between blocks,
    after the last)."""
    most = memory.max_fsdp_bytes
    forward = [most(f"forward {j}") for j in range(n)]
    backward = [most(f"backward {j}") for j in range(n)]
    backward[0] = max(backward[0], most("root backward"))
    stretches = [most("root forward"), *(most(f"between {j}") for j in range(n - 1)), most("head")]
    return forward, backward, stretches


def _raise(block: SacBlock, forward: int, backward: int) -> SacBlock:
    return replace(
        block,
        f_start=block.f_start + forward,
        f_peak=block.f_peak + forward,
        b_start=block.b_start + backward,
        b_peak=block.b_peak + backward,
    )


def shifted(union: SacUnion, memory: FsdpMemory) -> SacUnion:
    """The union with every window raised by its most FSDP bytes (module docstring): its plans'
    peaks bound the per-rank bytes above the resident ones."""
    n = len(union.blocks.blocks)
    fwd, bwd, between = _offsets(memory, n)
    blocks = tuple(_raise(b, fwd[j], bwd[j]) for j, b in enumerate(union.blocks.blocks))
    segments = tuple(Segment(s.peak + between[s.held], s.held) for s in union.blocks.segments)
    splits = []
    for j, split in enumerate(union.splits):
        if split is None:
            splits.append(None)
            continue
        last = len(split.segments) - 1
        inner = tuple(
            Segment(s.peak + (bwd[j] if i == last else fwd[j]), s.held)
            for i, s in enumerate(split.segments)
        )
        children = tuple(_raise(c, fwd[j], bwd[j]) for c in split.children)
        splits.append(SacSplit(children, inner))
    root = union.blocks.root_b_peak
    raised = None if root is None else root + memory.max_fsdp_bytes("root backward")
    problem = replace(union.blocks, blocks=blocks, segments=segments, root_b_peak=raised)
    return SacUnion(problem, tuple(splits))


def plan_windows(union: SacUnion, plan: UnionPlan) -> StepWindows:
    """The single-process step's windows per block under the plan (bytes above the step's
    start): each block's forward start and backward start less the savings held then, the
    most of its forward's and backward's terms (its children's and inner stretches' where it
    is split), and the stretches outside the blocks."""
    problem, flat = flatten(union, plan)
    owner: list[int] = []  # block of each flat region
    inner_owner: list[tuple[int, str]] = []  # block and window of each inner stretch
    for j, split in enumerate(union.splits):
        if split is None or plan.blocks.checkpointed[j]:
            owner.append(j)
            continue
        owner += [j] * len(split.children)
        last = len(split.segments) - 1
        inner_owner += [(j, "backward" if i == last else "forward") for i in range(last + 1)]
    n = len(union.blocks.blocks)
    d = [
        savings(b, c, s)
        for b, c, s in zip(problem.blocks, flat.checkpointed, flat.saved, strict=True)
    ]
    held = [0] * (n + 1)  # savings of blocks 0..j-1
    for j in range(n):
        held[j + 1] = held[j] + sum(x for x, o in zip(d, owner, strict=True) if o == j)
    f_start = [b.f_start - held[j] for j, b in enumerate(union.blocks.blocks)]
    b_start = [b.b_start - held[j + 1] for j, b in enumerate(union.blocks.blocks)]
    f_peak, b_peak = list(f_start), list(b_start)
    outside: list[Segment] = []
    for kind, i, value in plan_terms(problem, flat):
        if kind == "root":  # the windows carry the root's backward apart (below)
            continue
        if kind == "segment":
            if i < len(inner_owner):
                j, kind = inner_owner[i]
            else:
                outside.append(Segment(value, problem.segments[i].held))
                continue
        else:
            j = owner[i]
        peaks = f_peak if kind == "forward" else b_peak
        peaks[j] = max(peaks[j], value)
    first = [owner.index(j) for j in range(n)] + [len(owner)]
    segments = [Segment(s.peak, first.index(s.held)) for s in outside]
    p = union.blocks
    backward_start = None if p.backward_start is None else p.backward_start - held[n]
    windows = StepWindows.from_segments(
        f_start, f_peak, b_start, b_peak, segments, backward_start, p.end
    )
    # every block's backward is over at block 0's end: no plan changes the root's backward
    return replace(windows, root_b_start=p.root_b_start, root_b_peak=p.root_b_peak)


def rank_peak(union: SacUnion, plan: UnionPlan, memory: FsdpMemory) -> RankPeak:
    """The plan's per-rank peak: its windows (`plan_windows`) met with FSDP's moments."""
    return predict_peak(memory, plan_windows(union, plan))
