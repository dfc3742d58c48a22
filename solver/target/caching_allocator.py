"""A torch-free model of PyTorch's CUDA caching allocator: from a sequence of allocations and
frees on one stream, the bytes it reserves from the device (what a job fails on) beside the bytes
it hands out (``torch.cuda.memory_allocated``), and where a device of a given capacity runs out.

The policy is PyTorch's native allocator (``c10/cuda/CUDACachingAllocator.cpp``,
``DeviceCachingAllocator``; its configuration in ``c10/core/AllocatorConfig.{h,cpp}`` and
``c10/cuda/CUDAAllocatorConfig.h``), as torch 2.13 and 2.14 ship it. Each private method names
the torch function it follows (``get_free_block``, ``alloc_block``, ``should_split``,
``release_cached_blocks``, ``map_block``, ...); docs/allocator.md, "The policy modelled", gives
each step with its constants and their source lines, and "Not modelled" what is left out (more
than one stream, CUDA graph pools, ``cudaMallocAsync``, memory outside the allocator, ...). The
segments, blocks and pools are `solver.target.allocator_blocks`'; the settings
`solver.target.allocator_config`'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from solver.errors import ArgumentError, InternalError
from solver.target.allocator_blocks import (
    BlockInfo,
    DeviceSegment,
    MemoryBlock,
    Pool,
    SegmentInfo,
    expandable_size,
    merge,
    splice,
)
from solver.target.allocator_config import (
    ADDRESS_SPACE,
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
)

__all__ = ["AllocatorConfig", "AllocatorReport", "CachingAllocator", "simulate"]


class CachingAllocator:
    """The caching allocator's state on one stream of one device: call `allocate` and `free` in
    the order the program does; `allocated` and `reserved` are torch's ``memory_allocated`` and
    ``memory_reserved`` (bytes), and the counters its ``memory_stats``.

    ``capacity`` is the bytes the allocator can get from the device (``cudaMalloc`` fails past
    it); None for no limit.
    """

    def __init__(self, config: AllocatorConfig | None = None, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 0:
            raise ArgumentError(f"capacity {capacity}: give bytes >= 0, or None for no limit")
        self.config = config or AllocatorConfig()
        self.capacity = capacity
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.device_allocs = 0
        """``num_device_alloc``: ``cudaMalloc`` calls and page mappings."""
        self.device_frees = 0
        """``num_device_free``: ``cudaFree`` calls and page unmappings."""
        self.alloc_retries = 0
        """``num_alloc_retries``: allocations retried after releasing every cached segment."""
        self._pools = (Pool(small=True), Pool(small=False))
        self._segments: list[DeviceSegment] = []
        self._live: dict[Hashable, MemoryBlock] = {}
        self._next_address = SMALL_BUFFER

    @property
    def segments(self) -> int:
        """Live segments: ``cudaMalloc`` segments, and expandable segments once each."""
        return len(self._segments)

    def block_size(self, key: Hashable) -> int:
        """The bytes the allocation ``key`` holds (its rounded request, or more where the rest
        of its block was too small to split off)."""
        if key not in self._live:
            raise ArgumentError(f"block_size of {key!r}, which is not allocated")
        return self._live[key].size

    def allocate(self, key: Hashable, nbytes: int) -> bool:
        """Allocates ``nbytes`` (> 0) for the tensor ``key``; False where torch raises its
        out-of-memory error (cached segments are released first, as torch does)."""
        if nbytes <= 0 or key in self._live:
            raise ArgumentError(
                f"allocation {key!r} of {nbytes} bytes: give a key not live and bytes > 0 "
                "(torch allocates nothing for an empty tensor)"
            )
        size = self.config.round_size(nbytes)
        pool = self._pools[0] if size <= SMALL_SIZE else self._pools[1]
        block = self._cached_block(pool, size) or self._new_block(pool, size)
        if block is None:
            return False
        block = self._split(pool, block, size)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return True

    def free(self, key: Hashable) -> None:
        """Frees the allocation ``key``: its block merges with free neighbours and stays cached."""
        block = self._live.pop(key, None)
        if block is None:
            raise ArgumentError(f"free of {key!r}, which is not allocated")
        block.allocated = False
        self.allocated -= block.size
        pool = self._pool_of(block)
        merge(pool, block, block.prev)
        merge(pool, block, block.next)
        pool.add(block)

    def snapshot(self) -> tuple[SegmentInfo, ...]:
        """Every segment with its blocks, in address order."""
        every = [*self._live.values(), *(b for p in self._pools for b in p.blocks.values())]
        heads = {block.segment: block for block in every if block.prev is None}
        found = []
        for segment in sorted(self._segments, key=lambda s: s.address):
            blocks = []
            block: MemoryBlock | None = heads[segment]
            while block is not None:
                blocks.append(BlockInfo(block.address, block.size, block.allocated, block.mapped))
                block = block.next
            expandable = segment.page is not None
            found.append(
                SegmentInfo(segment.address, segment.size, segment.small, expandable, tuple(blocks))
            )
        return tuple(found)

    def _pool_of(self, block: MemoryBlock) -> Pool:
        return self._pools[0] if block.segment.small else self._pools[1]

    def _cached_block(self, pool: Pool, size: int) -> MemoryBlock | None:
        """``get_free_block``: the best-fitting cached block, taken out of the pool, or None."""
        index = bisect.bisect_left(pool.free, (size, -1))
        if index == len(pool.free):
            return None
        block = pool.cached(index)
        while (
            block.segment.page is not None
            and index + 1 < len(pool.free)
            and expandable_size(pool.cached(index + 1)) < expandable_size(block)
        ):
            index += 1
            block = pool.cached(index)
        limit = self.config.max_split_size
        if limit is not None and size < limit <= block.size:
            return None
        if (
            limit is not None
            and size >= limit
            and block.size >= size + self.config.non_split_rounding
        ):
            return None
        pool.remove(block)
        return block

    def _new_block(self, pool: Pool, size: int) -> MemoryBlock | None:
        """``malloc``'s path when no cached block fits: a new segment or pages, then the same
        after releasing cached oversize blocks, then after releasing every cached segment."""
        block = self._device_block(pool, size)
        if block is None and self._release_oversize(pool, size):
            block = self._device_block(pool, size)
        if block is None:
            self._release_cached()
            self.alloc_retries += 1
            block = self._device_block(pool, size)
        return block

    def _device_block(self, pool: Pool, size: int) -> MemoryBlock | None:
        """``alloc_block``: new device memory holding ``size`` bytes, or None at capacity."""
        if self.config.expandable_segments:
            return self._expandable_block(pool, size)
        nbytes = self.config.allocation_size(size)
        if not self._fits(nbytes):
            return None
        segment = self._new_segment(nbytes, pool.small, page=None)
        self._grow(nbytes)
        return MemoryBlock(segment.address, nbytes, segment)

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.device_allocs += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _new_segment(self, nbytes: int, small: bool, page: int | None) -> DeviceSegment:
        segment = DeviceSegment(self._next_address, nbytes, small, page)
        self._next_address += -(-nbytes // SMALL_BUFFER) * SMALL_BUFFER + SMALL_BUFFER
        self._segments.append(segment)
        return segment

    def _split(self, pool: Pool, block: MemoryBlock, size: int) -> MemoryBlock:
        """``should_split`` and ``alloc_found_block``: the block to hand out for ``size``, the
        rest of ``block`` cached where it is large enough."""
        rest = block.size - size
        if pool.small or self.config.expandable_segments:
            split = rest >= MIN_BLOCK_SIZE
        else:
            limit = self.config.max_split_size
            split = (limit is None or size < limit) and rest > SMALL_SIZE
        if not split:
            return block
        taken = MemoryBlock(block.address, size, block.segment)
        splice(taken, block.prev, block)
        block.address += size
        block.size = rest
        pool.add(block)
        return taken

    def _release_segment(self, pool: Pool, block: MemoryBlock) -> None:
        """``release_block``: ``cudaFree`` of a cached block that is a whole segment."""
        if block.prev is not None or block.next is not None or block.segment.page is not None:
            raise InternalError(f"release of block at {block.address}, not a whole segment")
        pool.remove(block)
        self._segments.remove(block.segment)
        self.reserved -= block.size
        self.device_frees += 1

    def _release_oversize(self, pool: Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size``, releases the smallest
        cached oversize block that holds the request, else the largest ones down to it; True
        where enough was released."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        wanted = max(size, limit)
        index = bisect.bisect_left(pool.free, (wanted, -1))
        if index < len(pool.free) and pool.cached(index).segment.page is None:
            self._release_segment(pool, pool.cached(index))
            return True
        released = 0
        index -= 1
        while released < wanted and index >= 0 and pool.cached(index).size >= limit:
            block = pool.cached(index)
            index -= 1
            if block.segment.page is None:
                released += block.size
                self._release_segment(pool, block)
        return released >= wanted

    def _release_cached(self) -> None:
        """``release_cached_blocks``: releases every cached whole segment and unmaps the free
        whole pages of expandable segments (an expandable segment left with no mapped page
        goes too)."""
        for pool in reversed(self._pools):
            cached = [pool.blocks[address] for _, address in pool.free]
            for block in cached:
                if block.segment.page is None:
                    if block.prev is None and block.next is None:
                        self._release_segment(pool, block)
                    continue
                self._unmap(pool, block)
                if block.prev is None and block.next is None and not block.mapped:
                    pool.remove(block)
                    self._segments.remove(block.segment)

    def _unmap(self, pool: Pool, block: MemoryBlock) -> None:
        """``unmap_block``: the whole pages inside a cached expandable block are unmapped; the
        bytes before and after them stay cached."""
        segment = block.segment
        page = segment.page or 0
        begin = -(-(block.address - segment.address) // page)
        end = (block.address + block.size - segment.address) // page
        if begin >= end:
            return
        pool.remove(block)
        start, nbytes = segment.address + begin * page, (end - begin) * page
        if start > block.address:
            before = MemoryBlock(block.address, start - block.address, segment, prev=block.prev)
            splice(before, block.prev, block)
            pool.add(before)
        if start + nbytes < block.address + block.size:
            after = MemoryBlock(
                start + nbytes, block.address + block.size - start - nbytes, segment
            )
            splice(after, block, block.next)
            pool.add(after)
        block.address, block.size, block.mapped = start, nbytes, False
        merge(pool, block, block.prev)
        merge(pool, block, block.next)
        pool.add(block)
        self.reserved -= nbytes
        self.device_frees += 1

    def _expandable_block(self, pool: Pool, size: int) -> MemoryBlock | None:
        """``try_allocate_expandable_block``: maps pages where free and unmapped space together
        first hold ``size`` bytes; the mapped block (taken out of the pool), or None at
        capacity."""
        candidate = self._expandable_candidate(pool, size)
        if not candidate.mapped and not self._map(pool, candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            if following is None or following.allocated:
                raise InternalError("expandable candidate without the space it was chosen for")
            if not self._map(pool, following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _expandable_candidate(self, pool: Pool, size: int) -> MemoryBlock:
        """``find_expandable_block``: the lowest unmapped block (with the cached block before
        it) from which free and unmapped space hold ``size`` bytes, else a new segment's."""

        def room(block: MemoryBlock | None) -> int:
            total = 0
            while total < size and block is not None and not block.allocated:
                total += block.size
                block = block.next
            return total

        for address in pool.unmapped:
            candidate = pool.blocks[address]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            if room(candidate) >= size:
                return candidate
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        segment = self._new_segment(ADDRESS_SPACE, pool.small, page)
        block = MemoryBlock(segment.address, segment.size, segment, mapped=False)
        pool.add(block)
        return block

    def _map(self, pool: Pool, block: MemoryBlock, nbytes: int) -> bool:
        """``map_block``: maps the pages of ``block``'s first ``nbytes`` (False at capacity);
        the mapped part merges with cached neighbours and is cached."""
        segment = block.segment
        page = segment.page or 0
        offset = block.address - segment.address
        mapped = -(-(offset + nbytes) // page) * page - offset
        if not self._fits(mapped):
            return False
        pool.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = MemoryBlock(block.address + mapped, block.size - mapped, segment, mapped=False)
            splice(rest, block, block.next)
            pool.add(rest)
            block.size = mapped
        merge(pool, block, block.prev)
        merge(pool, block, block.next)
        pool.add(block)
        self._grow(mapped)
        return True


@dataclass(frozen=True)
class AllocatorReport:
    """What the caching allocator does over a run (bytes): peaks of ``memory_allocated`` and
    ``memory_reserved`` and the index of the event that first reached each, both at the end,
    live segments at the end, ``num_device_alloc``, ``num_device_free`` and
    ``num_alloc_retries``, the events run, and ``oom_event``: the index of the allocation
    that fails at ``capacity`` after releasing cached segments (the run stops there), or None.
    """

    peak_allocated: int
    peak_reserved: int
    allocated: int
    reserved: int
    segments: int
    device_allocs: int
    device_frees: int
    alloc_retries: int
    peak_allocated_event: int | None
    peak_reserved_event: int | None
    oom_event: int | None
    events: int

    @property
    def fits(self) -> bool:
        """Whether every allocation succeeded."""
        return self.oom_event is None


def simulate(
    events: Iterable[tuple[Hashable, int]],
    config: AllocatorConfig | None = None,
    capacity: int | None = None,
) -> AllocatorReport:
    """Runs the caching allocator over ``events``, each ``(key, nbytes)``: ``nbytes`` > 0
    allocates that many bytes for the tensor ``key``, ``nbytes`` == 0 frees ``key`` (torch
    allocates nothing for an empty tensor, so a sequence leaves those out). ``capacity``: the
    bytes the allocator can get from the device, None for no limit. Stops at the first
    allocation that fails."""
    allocator = CachingAllocator(config, capacity)
    peak_allocated_event = peak_reserved_event = oom_event = None
    count = 0
    for index, (key, nbytes) in enumerate(events):
        count = index + 1
        before = allocator.peak_allocated, allocator.peak_reserved
        if nbytes == 0:
            allocator.free(key)
        elif not allocator.allocate(key, nbytes):
            oom_event = index
            break
        if allocator.peak_allocated > before[0]:
            peak_allocated_event = index
        if allocator.peak_reserved > before[1]:
            peak_reserved_event = index
    return AllocatorReport(
        peak_allocated=allocator.peak_allocated,
        peak_reserved=allocator.peak_reserved,
        allocated=allocator.allocated,
        reserved=allocator.reserved,
        segments=allocator.segments,
        device_allocs=allocator.device_allocs,
        device_frees=allocator.device_frees,
        alloc_retries=allocator.alloc_retries,
        peak_allocated_event=peak_allocated_event,
        peak_reserved_event=peak_reserved_event,
        oom_event=oom_event,
        events=count,
    )
