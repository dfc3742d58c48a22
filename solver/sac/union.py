"""The union of region granularities: per block, no region, the whole block as a region, or its
children (attention, MLP, ...) as regions. Torch-free.

A `SacUnion` is the blocks' `SacProblem` (each block's windows, the stretches between blocks)
and, per block that can be split, a `SacSplit`: its children as `SacBlock`s and the stretches of
the block's own windows outside its children, all cut from the same measured plain step as the
blocks' windows. A `UnionPlan` checkpoints a block whole or some of its children, never both.

The reference (`union_peak`, `union_cost`) reduces a union plan to a plan of one sequence of
regions (`flatten`): a block checkpointed whole, or one without a split, stays one region; every
other block is replaced by its children, its inner stretches becoming segments whose savings
are those of the block's leading children. The memory model is then NOTE [ SAC memory model ]
(solver/sac/memory.py) unchanged. A block not checkpointed at all reads the same either way:
its children's windows and inner stretches partition its own windows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from solver.core.link import Link
from solver.errors import ArgumentError, InvalidPlanError
from solver.sac.memory import SacPlan, plan_cost, plan_host, plan_peak
from solver.sac.problem import SacBlock, SacProblem, Segment


@dataclass(frozen=True)
class SacSplit:
    """A block's children in forward order, and the stretches of the block's forward and
    backward windows outside them (`held`: how many leading children hold their savings)."""

    children: tuple[SacBlock, ...]
    segments: tuple[Segment, ...]

    def to_json(self) -> dict:
        return {
            "children": [c.to_json() for c in self.children],
            "segments": [asdict(s) for s in self.segments],
        }

    @classmethod
    def from_json(cls, d: dict) -> SacSplit:
        return cls(
            tuple(SacBlock.from_json(c) for c in d["children"]),
            tuple(Segment(**s) for s in d["segments"]),
        )


@dataclass(frozen=True)
class SacUnion:
    """The blocks' problem and, per block, its split (None: the block cannot be split)."""

    blocks: SacProblem
    splits: tuple[SacSplit | None, ...]

    def __post_init__(self) -> None:
        if len(self.splits) != len(self.blocks.blocks):
            raise ArgumentError(f"{len(self.splits)} splits for {len(self.blocks.blocks)} blocks")

    @property
    def plain_peak(self) -> int:
        return self.blocks.plain_peak

    @property
    def plain_peak_basis(self) -> str:
        return self.blocks.plain_peak_basis

    def regions(self) -> list[SacBlock]:
        """Every candidate region: each block followed by its split's children, if any."""
        out: list[SacBlock] = []
        for block, split in zip(self.blocks.blocks, self.splits, strict=True):
            out += [block, *(split.children if split is not None else ())]
        return out

    @classmethod
    def whole(cls, problem: SacProblem) -> SacUnion:
        """The union of a problem whose blocks cannot be split."""
        return cls(problem, (None,) * len(problem.blocks))

    def to_json(self) -> dict:
        return {
            "blocks": self.blocks.to_json(),
            "splits": [None if s is None else s.to_json() for s in self.splits],
        }

    @classmethod
    def from_json(cls, d: dict) -> SacUnion:
        return cls(
            SacProblem.from_json(d["blocks"]),
            tuple(None if s is None else SacSplit.from_json(s) for s in d["splits"]),
        )


@dataclass(frozen=True)
class UnionPlan:
    """`blocks`: the plan of the whole blocks; `children`: per block, its children's plan (None
    where the block has no split)."""

    blocks: SacPlan
    children: tuple[SacPlan | None, ...]


def check_union_plan(union: SacUnion, plan: UnionPlan) -> None:
    """InvalidPlanError unless the plan fits the union: a child plan exactly where there is a split,
    and no block checkpointed both whole and in a child."""
    if len(plan.children) != len(union.splits):
        n = len(union.splits)
        raise InvalidPlanError(f"plan has {len(plan.children)} child plans, the union {n} blocks")
    for j, (split, sub) in enumerate(zip(union.splits, plan.children, strict=True)):
        if (split is None) != (sub is None):
            raise InvalidPlanError(f"block {j}: a child plan must exist exactly where a split does")
        if sub is not None and plan.blocks.checkpointed[j] and any(sub.checkpointed):
            raise InvalidPlanError(f"block {j} is checkpointed whole and in a child")
        if sub is not None and plan.blocks.plain_offloads()[j]:
            raise InvalidPlanError(f"block {j} has children: its children offload, not the block")
        if sub is not None and plan.blocks.checkpointed[j] and any(sub.plain_offloads()):
            raise InvalidPlanError(f"block {j} is checkpointed whole and offloads in a child")


def flatten(union: SacUnion, plan: UnionPlan) -> tuple[SacProblem, SacPlan]:
    """The one-sequence problem and plan the union plan runs as (module docstring)."""
    check_union_plan(union, plan)
    blocks: list[SacBlock] = []
    checkpointed: list[bool] = []
    saved: list[frozenset[int]] = []
    offloaded: list[frozenset[int]] = []
    plain: list[bool] = []
    first: list[int] = []  # flat index of each block's first region
    segments: list[Segment] = []
    for j, (block, split, sub) in enumerate(
        zip(union.blocks.blocks, union.splits, plan.children, strict=True)
    ):
        first.append(len(blocks))
        if split is None or plan.blocks.checkpointed[j]:
            blocks.append(block)
            checkpointed.append(plan.blocks.checkpointed[j])
            saved.append(plan.blocks.saved[j])
            offloaded.append(plan.blocks.offloads()[j])
            plain.append(plan.blocks.plain_offloads()[j])
            continue
        segments += [Segment(s.peak, len(blocks) + s.held) for s in split.segments]
        blocks += split.children
        checkpointed += sub.checkpointed
        saved += sub.saved
        offloaded += sub.offloads()
        plain += sub.plain_offloads()
    first.append(len(blocks))
    segments += [Segment(s.peak, first[s.held]) for s in union.blocks.segments]
    problem = SacProblem(
        tuple(blocks),
        tuple(segments),
        union.plain_peak,
        offload_seconds=union.blocks.offload_seconds,
        backward_start=union.blocks.backward_start,
        root_b_start=union.blocks.root_b_start,
        root_b_peak=union.blocks.root_b_peak,
        end=union.blocks.end,
    )
    offloads = tuple(offloaded) if any(offloaded) else None
    plains = tuple(plain) if any(plain) else None
    return problem, SacPlan(tuple(checkpointed), tuple(saved), offloads, plains)


def union_peak(union: SacUnion, plan: UnionPlan) -> int:
    """Predicted peak bytes of the step under the union plan."""
    return plan_peak(*flatten(union, plan))


def union_cost(union: SacUnion, plan: UnionPlan, link: Link | None = None) -> float:
    """Modelled seconds the union plan adds to the step (`solver.sac.memory.plan_cost`), its
    copies' stall over `link` included."""
    return plan_cost(*flatten(union, plan), link)


def union_host(union: SacUnion, plan: UnionPlan, link: Link | None = None) -> int:
    """Host bytes the union plan's offloaded storages hold at their most, each host buffer as
    `link`'s host allocator rounds it (`solver.sac.memory.plan_host`; None: as requested)."""
    return plan_host(*flatten(union, plan), link)
