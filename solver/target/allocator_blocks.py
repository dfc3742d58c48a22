"""The caching allocator model's pieces (`solver.target.caching_allocator`): segments, the
blocks they are cut into (a list linked by ``prev`` and ``next`` in address order: `splice`,
`merge`), the pools that cache free blocks, and the snapshot's read-only views of them
(`SegmentInfo`, `BlockInfo`). Torch-free; bytes and addresses throughout."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from solver.errors import InternalError

__all__ = [
    "BlockInfo",
    "DeviceSegment",
    "MemoryBlock",
    "Pool",
    "SegmentInfo",
    "block_key",
    "expandable_size",
    "merge",
    "splice",
]


@dataclass(eq=False)
class DeviceSegment:
    """One ``cudaMalloc`` (``page`` None) or one expandable segment's address space (``page``:
    the bytes mapped at a time)."""

    address: int
    size: int
    small: bool
    page: int | None


@dataclass(eq=False)
class MemoryBlock:
    """A piece of a segment: allocated, cached free (``mapped``) or unmapped address space."""

    address: int
    size: int
    segment: DeviceSegment
    allocated: bool = False
    mapped: bool = True
    prev: MemoryBlock | None = None
    next: MemoryBlock | None = None


class Pool:
    """The cached free blocks of one pool ordered by (size, address), and its unmapped
    expandable address space ordered by address (``BlockPool``)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: list[tuple[int, int]] = []
        self.unmapped: list[int] = []
        self.blocks: dict[int, MemoryBlock] = {}

    def add(self, block: MemoryBlock) -> None:
        bisect.insort(self.free if block.mapped else self.unmapped, block_key(block))
        self.blocks[block.address] = block

    def remove(self, block: MemoryBlock) -> None:
        keys = self.free if block.mapped else self.unmapped
        index = bisect.bisect_left(keys, block_key(block))
        if index == len(keys) or keys[index] != block_key(block):
            raise InternalError(f"block at {block.address} is not in its pool")
        del keys[index]
        del self.blocks[block.address]

    def cached(self, index: int) -> MemoryBlock:
        return self.blocks[self.free[index][1]]


def block_key(block: MemoryBlock) -> tuple[int, int] | int:
    return (block.size, block.address) if block.mapped else block.address


def splice(block: MemoryBlock, before: MemoryBlock | None, after: MemoryBlock | None) -> None:
    """Links ``block`` between ``before`` and ``after``."""
    block.prev, block.next = before, after
    if before is not None:
        before.next = block
    if after is not None:
        after.prev = block


def merge(pool: Pool, block: MemoryBlock, other: MemoryBlock | None) -> None:
    """``try_merge_blocks``: ``other``, a neighbour, joins ``block`` (not in the pool) where
    both are free and both mapped or both not."""
    if other is None or other.allocated or other.mapped != block.mapped:
        return
    pool.remove(other)
    if block.prev is other:
        block.address = other.address
        block.prev = other.prev
        if block.prev is not None:
            block.prev.next = block
    else:
        block.next = other.next
        if block.next is not None:
            block.next.prev = block
    block.size += other.size


def expandable_size(block: MemoryBlock) -> int:
    """A cached block's size for best fit under expandable segments: with the unmapped space
    right after it (``expandable_size``)."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment (bytes): in use, cached free, or (expandable) not mapped."""

    address: int
    size: int
    allocated: bool
    mapped: bool


@dataclass(frozen=True)
class SegmentInfo:
    """One segment (bytes), as ``torch.cuda.memory_snapshot`` lists them, its blocks in address
    order; an expandable one with its unmapped address space."""

    address: int
    size: int
    small_pool: bool
    expandable: bool
    blocks: tuple[BlockInfo, ...]
