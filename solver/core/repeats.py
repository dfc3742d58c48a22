"""Repeated blocks of a captured graph: which nodes are copies of one another.

A captured graph's `module` paths number its repeated blocks (`model.h.3.attn.c_attn`,
`layer2.1.conv1`). A node's *block* is the tuple of the numeric parts of its path, its
*template* the path with them replaced by `*`. Two nodes are mirrors when they are in different
blocks and share the template, the phase (forward or backward), their rank among the nodes of
their own path and phase in solver order, their bytes and their numbers of inputs and users:
the same op of two copies of a layer, as a traced loop over identical modules lays them out.

Mirrors are a hint for searches (a change tried in one block is tried in all of them at once),
never something the validity of a plan depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.core.graph import Problem

BlockIndex = tuple[str, ...]
"""The numeric parts of a module path, in order: ("3",) for `model.h.3.attn`."""


@dataclass(frozen=True)
class Mirrors:
    """The mirror groups of a problem.

    groups: each group's nodes, ascending, in different blocks (at least two).
    group_of: per node, the index of its group (-1: none).
    block: per node, its block (() where its path has no numeric part).
    """

    groups: tuple[tuple[int, ...], ...]
    group_of: tuple[int, ...]
    block: tuple[BlockIndex, ...]

    def of(self, v: int) -> tuple[int, ...]:
        """v's group (v among them), or () where v has no mirror."""
        g = self.group_of[v]
        return self.groups[g] if g >= 0 else ()

    def counterpart(self, v: int, block: BlockIndex) -> int | None:
        """The mirror of v in `block` (v itself where v is in it), or None where there is none."""
        if self.block[v] == block:
            return v
        for w in self.of(v):
            if self.block[w] == block:
                return w
        return None

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def blocks(self) -> list[BlockIndex]:
        """The blocks that hold a grouped node, in the order of their first node."""
        return list(dict.fromkeys(self.block[v] for v in sorted(v for g in self.groups for v in g)))


def mirrors(problem: Problem) -> Mirrors:
    """The mirror groups of `problem` (module docstring); none where no module path has a
    numeric part. O(V)."""
    blocks: list[BlockIndex] = []
    by_key: dict[tuple, list[int]] = {}
    rank: dict[tuple[str, bool], int] = {}
    for v, path in enumerate(problem.module):
        parts = path.split(".") if path else []
        block = tuple(p for p in parts if p.isdigit())
        blocks.append(block)
        if not block:
            continue
        template = ".".join("*" if p.isdigit() else p for p in parts)
        phase = problem.backward[v]
        k = rank.get((path, phase), 0)
        rank[path, phase] = k + 1
        key = (template, phase, k, problem.mem[v], len(problem.preds[v]), len(problem.succs[v]))
        by_key.setdefault(key, []).append(v)
    groups = tuple(tuple(nodes) for nodes in by_key.values() if len(nodes) > 1)
    group_of = [-1] * problem.n
    for g, nodes in enumerate(groups):
        for v in nodes:
            group_of[v] = g
    return Mirrors(groups, tuple(group_of), tuple(blocks))
