"""The caching allocator model (solver/target/caching_allocator.py): cases derived by hand from
torch's policy (c10/cuda/CUDACachingAllocator.cpp; each derivation in its comment), the settings
string, and invariants over drawn sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.errors import ArgumentError
from solver.target.caching_allocator import (
    AllocatorConfig,
    CachingAllocator,
    simulate,
)

KIB = 1 << 10
MIB = 1 << 20
EXPANDABLE = AllocatorConfig(expandable_segments=True)


def _free(key: str) -> tuple[str, int]:
    return (key, 0)


@pytest.mark.parametrize(
    ("nbytes", "allocated", "reserved"),
    [
        # 1 B < kMinBlockSize: 512 B, small pool (<= kSmallSize), a 2 MiB segment (kSmallBuffer)
        (1, 512, 2 * MIB),
        # 1 MiB is still small (size <= kSmallSize): a 2 MiB segment, split (1 MiB rest >= 512)
        (MIB, MIB, 2 * MIB),
        # 1 MiB + 1 rounds to 1 MiB + 512: large pool, under kMinLargeAlloc: a 20 MiB segment
        # (kLargeBuffer); the rest, 19 MiB - 512, is over 1 MiB: split
        (MIB + 1, MIB + 512, 20 * MIB),
        # 3 MiB: large, under 10 MiB: a 20 MiB segment, split (17 MiB rest)
        (3 * MIB, 3 * MIB, 20 * MIB),
        # 10 MiB - 513 rounds up to 10 MiB - 512, under kMinLargeAlloc: 20 MiB, split
        (10 * MIB - 513, 10 * MIB - 512, 20 * MIB),
        # 10 MiB - 1 rounds up to 10 MiB, not under kMinLargeAlloc: a 10 MiB segment
        (10 * MIB - 1, 10 * MIB, 10 * MIB),
        # 10 MiB is not under kMinLargeAlloc: its size rounded up to 2 MiB (kRoundLarge), 10 MiB
        (10 * MIB, 10 * MIB, 10 * MIB),
        # 11 MiB: a 12 MiB segment; the rest, 1 MiB, is not over 1 MiB: not split, so the whole
        # 12 MiB block is allocated (allocated_bytes counts block sizes)
        (11 * MIB, 12 * MIB, 12 * MIB),
        # 11 MiB + 1 rounds to 11 MiB + 512: a 12 MiB segment, rest 1 MiB - 512: not split
        (11 * MIB + 1, 12 * MIB, 12 * MIB),
    ],
)
def test_one_allocation_rounds_and_takes_the_segment_torch_would(nbytes, allocated, reserved):
    report = simulate([("a", nbytes)])
    assert (report.allocated, report.reserved) == (allocated, reserved)
    assert (report.segments, report.device_allocs, report.fits) == (1, 1, True)


def test_a_freed_block_is_reused_and_reserved_does_not_grow():
    # a: a 12 MiB segment; freed, it stays cached (reserved 12 MiB); b of the same size takes
    # it by best fit: no second cudaMalloc
    report = simulate([("a", 12 * MIB), _free("a"), ("b", 12 * MIB)])
    assert (report.reserved, report.device_allocs, report.allocated) == (12 * MIB, 1, 12 * MIB)


def test_a_cached_block_is_split_when_the_rest_is_over_one_mib():
    # a frees a 12 MiB block; b (4 MiB) takes it and the rest, 8 MiB > 1 MiB, is split off and
    # cached; c (8 MiB) fits that rest exactly: still one segment of 12 MiB
    allocator = CachingAllocator()
    assert allocator.allocate("a", 12 * MIB)
    allocator.free("a")
    assert allocator.allocate("b", 4 * MIB) and allocator.block_size("b") == 4 * MIB
    assert allocator.allocate("c", 8 * MIB) and allocator.block_size("c") == 8 * MIB
    assert (allocator.reserved, allocator.device_allocs) == (12 * MIB, 1)


def test_a_large_rest_of_one_mib_or_less_stays_with_the_block():
    # a (3 MiB) then freed: one cached 20 MiB block. 19 MiB leaves 1 MiB, not over kSmallSize:
    # not split, the request holds all 20 MiB. 18.5 MiB leaves 1.5 MiB: split
    whole = CachingAllocator()
    assert whole.allocate("a", 3 * MIB)
    whole.free("a")
    assert whole.allocate("b", 19 * MIB) and whole.block_size("b") == 20 * MIB
    split = CachingAllocator()
    assert split.allocate("a", 3 * MIB)
    split.free("a")
    assert split.allocate("b", 18 * MIB + MIB // 2) and split.block_size("b") == 37 * MIB // 2


def test_small_requests_pack_into_two_mib_segments_and_never_use_the_large_pool():
    # four 512 KiB requests fill one 2 MiB small segment (the last takes the 512 KiB rest
    # whole); the fifth needs a second one. A cached large block (17 MiB left of a 3 MiB
    # request's 20 MiB segment) is not lent to the small pool
    events = [(f"s{i}", 512 * KIB) for i in range(4)]
    assert simulate(events).reserved == 2 * MIB
    assert simulate([*events, ("s4", 512 * KIB)]).reserved == 4 * MIB
    assert simulate([("big", 3 * MIB), ("small", 1)]).reserved == 22 * MIB


def test_freed_neighbours_merge_into_one_block():
    # a and b (3 MiB each) split one 20 MiB segment: [a 3][b 3][14 free]. Freed, the three
    # merge back into the 20 MiB block, which a 20 MiB request then takes: no new segment
    events = [("a", 3 * MIB), ("b", 3 * MIB), _free("a"), _free("b"), ("c", 20 * MIB)]
    report = simulate(events)
    assert (report.reserved, report.device_allocs, report.allocated) == (20 * MIB, 1, 20 * MIB)


def test_fragmentation_grows_reserved_where_expandable_segments_do_not():
    # Two 20 MiB tensors, freed, then one of 22 MiB (the next step's slightly larger batch).
    # Native: two 20 MiB segments stay cached apart (separate cudaMallocs never merge), neither
    # holds 22 MiB: a third segment, reserved 62 MiB for a peak of 40 MiB allocated.
    # Expandable: both 20 MiB requests map a 20 MiB page each of one segment; freed they merge
    # into one 40 MiB block, which the 22 MiB request splits: reserved stays 40 MiB
    events = [("x1", 20 * MIB), ("x2", 20 * MIB), _free("x1"), _free("x2"), ("y", 22 * MIB)]
    native = simulate(events)
    expandable = simulate(events, EXPANDABLE)
    assert (native.peak_allocated, native.peak_reserved) == (40 * MIB, 62 * MIB)
    assert native.peak_reserved_event == 4 and native.peak_allocated_event == 1
    assert (expandable.peak_allocated, expandable.peak_reserved) == (40 * MIB, 40 * MIB)
    assert expandable.segments == 1


def test_expandable_segments_map_pages_and_reuse_the_free_tail():
    # Small pool pages are 2 MiB: 1 B maps one. Large pool pages are 20 MiB: 3 MiB maps one
    # and leaves a 17 MiB free tail, which then holds 12 MiB (native would cudaMalloc 12 MiB)
    report = simulate([("s", 1), ("a", 3 * MIB), ("b", 12 * MIB)], EXPANDABLE)
    assert (report.reserved, report.segments, report.device_allocs) == (22 * MIB, 2, 2)
    # 15 MiB maps a 20 MiB page (5 MiB free tail); 10 MiB does not fit the tail: the pages
    # mapped start at the tail, 5 MiB short, so one more page: 40 MiB, where native holds a
    # 16 MiB and a 10 MiB segment (26 MiB). Expandable segments are not always smaller
    events = [("a", 15 * MIB), ("b", 10 * MIB)]
    assert simulate(events, EXPANDABLE).reserved == 40 * MIB
    assert simulate(events).reserved == 26 * MIB


def test_expandable_best_fit_counts_the_unmapped_space_after_a_free_tail():
    # One 20 MiB page: x [0, 6), y [6, 16), a free tail [16, 20) before the unmapped space. x
    # freed: cached [0, 6) and the tail, 4 MiB. z (4 MiB): best fit by size is the tail, but
    # get_free_block weighs a block followed by unmapped space as that much larger
    # (expandable_size), so z takes [0, 4) and leaves [4, 6). w (5 MiB) then fits neither
    # 2 MiB nor 4 MiB: the tail grows by a page, 40 MiB reserved (20 MiB had z taken the tail)
    events = [("x", 6 * MIB), ("y", 10 * MIB), _free("x"), ("z", 4 * MIB), ("w", 5 * MIB)]
    allocator = CachingAllocator(EXPANDABLE)
    for key, nbytes in events:
        if nbytes:
            assert allocator.allocate(key, nbytes)
        else:
            allocator.free(key)
    (segment,) = allocator.snapshot()
    assert segment.blocks[0].address == segment.address and segment.blocks[0].allocated
    assert allocator.reserved == 40 * MIB


def _reserved_after_each(events, config=None) -> list[int]:
    allocator = CachingAllocator(config)
    reserved = []
    for key, nbytes in events:
        if nbytes:
            assert allocator.allocate(key, nbytes)
        else:
            allocator.free(key)
        reserved.append(allocator.reserved // MIB)
    return reserved


def test_the_walk_throughs_of_pytorchs_fragmentation_devlog():
    # Edward Yang, "When does fragmentation occur in the CUDA caching allocator?", PyTorch
    # DevLog, 2026-06-01 (github.com/pytorch/devlogs, content/eager/
    # 2026-06-01-cuda-caching-allocator.md): the MiB reserved its walk-throughs state.
    small = [(f"s{i}", 16 * MIB) for i in range(8)]
    large = [(f"l{i}", 32 * MIB) for i in range(4)]
    free_small = [_free(key) for key, _ in small]
    free_large = [_free(key) for key, _ in large]
    # without expandable segments, small then large: 8 segments of 16, kept; 4 more of 32
    assert simulate([*small, *free_small, *large]).reserved == 256 * MIB
    # large then small: each 32 MiB segment splits into two 16 MiB blocks: 128
    assert simulate([*large, *free_large, *small]).reserved == 128 * MIB
    # with expandable segments (20 MiB pages), 8 x 16 MiB map 20, 40, 60, 80, 80, 100, 120,
    # 140 MiB; all freed, they merge and 4 x 32 MiB map nothing more
    steps = _reserved_after_each([*small, *free_small, *large], EXPANDABLE)
    assert steps[:8] == [20, 40, 60, 80, 80, 100, 120, 140] and steps[-1] == 140
    # live blocks pin the splits: with #0 and #2 of four 16 MiB freed, 32 MiB grows the
    # segment (the 16 MiB free tail plus one page); all freed, 32 MiB fits without growing
    four = [(f"f{i}", 16 * MIB) for i in range(4)]
    pinned = [*four, _free("f0"), _free("f2"), ("big", 32 * MIB), _free("big")]
    everything = [*pinned, _free("f1"), _free("f3"), ("again", 32 * MIB)]
    steps = _reserved_after_each(everything, EXPANDABLE)
    assert steps[3] == 80 and steps[6] == 100 and steps[-1] == 100
    # the 1 MiB boundary: 2 MiB then 0.5 MiB use both pools (20 + 2 MiB), 2 then 2 share one
    assert simulate([("a", 2 * MIB), _free("a"), ("b", MIB // 2)], EXPANDABLE).reserved == 22 * MIB
    assert simulate([("a", 2 * MIB), _free("a"), ("b", 2 * MIB)], EXPANDABLE).reserved == 20 * MIB


def test_at_capacity_cached_segments_are_released_and_then_the_allocation_fails():
    # a, b: 20 MiB segments each (reserved 40 MiB = capacity); a freed stays cached. c (22 MiB)
    # fits no cached block; cudaMalloc of 22 MiB fails; release_cached_blocks frees a's whole
    # segment (reserved 20 MiB) and the retry needs 42 MiB: out of memory at event 3
    events = [("a", 20 * MIB), ("b", 20 * MIB), _free("a"), ("c", 22 * MIB), ("d", 1)]
    report = simulate(events, capacity=40 * MIB)
    assert (report.oom_event, report.events, report.fits) == (3, 4, False)
    assert (report.reserved, report.device_frees, report.alloc_retries) == (20 * MIB, 1, 1)
    # with 4 MiB more the retry succeeds (20 + 22 MiB) and d's 2 MiB small segment fits too
    roomier = simulate(events, capacity=44 * MIB)
    assert roomier.fits and (roomier.reserved, roomier.alloc_retries) == (44 * MIB, 1)


def test_with_max_split_size_oversize_blocks_are_kept_whole_and_released_first():
    limit = AllocatorConfig(max_split_size=20 * MIB)
    # a 40 MiB block (over max_split_size) cached: a 12 MiB request, under the limit, may not
    # take it (new 12 MiB segment); a 30 MiB request, over it, takes it whole (40 < 30 + 20,
    # max_non_split_rounding_size), unsplit
    allocator = CachingAllocator(limit)
    assert allocator.allocate("a", 40 * MIB)
    allocator.free("a")
    assert allocator.allocate("b", 12 * MIB) and allocator.reserved == 52 * MIB
    assert allocator.allocate("c", 30 * MIB) and allocator.block_size("c") == 40 * MIB
    # at capacity 50 MiB, the 12 MiB cudaMalloc fails (40 + 12 > 50) and
    # release_available_cached_blocks frees the cached 40 MiB block before any full release:
    # no retry counted
    report = simulate([("a", 40 * MIB), _free("a"), ("b", 12 * MIB)], limit, capacity=50 * MIB)
    assert report.fits and (report.reserved, report.device_frees, report.alloc_retries) == (
        12 * MIB,
        1,
        0,
    )


def test_expandable_segments_unmap_free_pages_at_capacity():
    # a, b map one 20 MiB page each; a freed leaves page 0 mapped and free. c (30 MiB) needs
    # two more pages at the tail (b's page is in use): 80 MiB > 60. release_cached_blocks
    # unmaps page 0 (reserved 20 MiB); the hole (20 MiB) cannot hold 30 MiB, so the tail is
    # mapped again: 20 + 40 = 60 MiB fits. At 50 MiB it does not: out of memory at event 3
    events = [("a", 20 * MIB), ("b", 20 * MIB), _free("a"), ("c", 30 * MIB)]
    fits = simulate(events, EXPANDABLE, capacity=60 * MIB)
    assert fits.fits and (fits.reserved, fits.device_frees, fits.alloc_retries) == (60 * MIB, 1, 1)
    assert fits.device_allocs == 3
    short = simulate(events, EXPANDABLE, capacity=50 * MIB)
    assert (short.oom_event, short.reserved) == (3, 20 * MIB)


def test_roundup_power2_divisions_round_to_the_next_step():
    four = AllocatorConfig(roundup_power2_divisions=4)
    # 5 MiB + 1 lies between 4 and 8 MiB: steps of 1 MiB, the next is 6 MiB
    assert four.round_size(5 * MIB + 1) == 6 * MIB
    # a power of two stays; 1200 B is not over 512 x 4: plain 512 rounding, 1536
    assert four.round_size(8 * MIB) == 8 * MIB and four.round_size(1200) == 1536
    # 3 MiB + 1 with 2 divisions: steps of 1 MiB between 2 and 4 MiB: 4 MiB
    assert AllocatorConfig(roundup_power2_divisions=2).round_size(3 * MIB + 1) == 4 * MIB
    assert AllocatorConfig().round_size(5 * MIB + 1) == 5 * MIB + 512


def test_parse_reads_torchs_settings_string():
    config = AllocatorConfig.parse(
        "expandable_segments:True, max_split_size_mb:512,roundup_power2_divisions:[256:1,512:2,"
        "1024:4,>:8],garbage_collection_threshold:0.6,pinned_use_background_threads:True"
    )
    assert config.expandable_segments and config.max_split_size == 512 * MIB
    assert config.garbage_collection_threshold == 0.6
    # 256 MiB is interval 8: it and all below get 1; 512 MiB (9) 2; 1024 MiB (10) 4; '>' the rest
    assert config.roundup_power2_divisions == (1,) * 9 + (2, 4) + (8,) * 5
    assert AllocatorConfig.parse("") == AllocatorConfig()
    assert AllocatorConfig.parse("large_segment_size_mb:64").allocation_size(3 * MIB) == 64 * MIB
    assert AllocatorConfig.parse("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ("expandable_segment:True", "unknown allocator setting 'expandable_segment'.*max_split"),
        ("expandable_segments:yes", "True or False"),
        ("max_split_size_mb:10", "at least large_segment_size"),
        ("per_process_memory_fraction:0.5", "not modelled.*capacity"),
        ("backend:cudaMallocAsync", "not modelled"),
        ("garbage_collection_threshold:1.5", r"in \(0, 1\)"),
        ("roundup_power2_divisions:[3:2]", "not a power of 2"),
        ("max_split_size_mb", "expected 'max_split_size_mb:<value>'"),
    ],
)
def test_parse_refuses_what_torch_refuses_or_the_model_cannot_follow(conf, message):
    with pytest.raises(ArgumentError, match=message):
        AllocatorConfig.parse(conf)


def test_allocate_and_free_refuse_keys_out_of_order():
    allocator = CachingAllocator()
    assert allocator.allocate("a", 1)
    with pytest.raises(ArgumentError, match="not live"):
        allocator.allocate("a", 1)
    with pytest.raises(ArgumentError, match="not allocated"):
        allocator.free("b")
    with pytest.raises(ArgumentError, match="not allocated"):
        allocator.block_size("b")
    with pytest.raises(ArgumentError, match="bytes > 0"):
        allocator.allocate("c", -1)
    with pytest.raises(ArgumentError, match="capacity"):
        CachingAllocator(capacity=-1)


CONFIGS = st.sampled_from(
    [
        AllocatorConfig(),
        EXPANDABLE,
        AllocatorConfig(max_split_size=20 * MIB),
        AllocatorConfig(roundup_power2_divisions=4),
        AllocatorConfig(expandable_segments=True, roundup_power2_divisions=2),
    ]
)
SIZES = st.one_of(
    st.integers(1, MIB),
    st.integers(MIB + 1, 10 * MIB),
    st.integers(10 * MIB, 64 * MIB),
    st.sampled_from([512, MIB, 2 * MIB, 20 * MIB, 22 * MIB]),
)


@st.composite
def _events(draw) -> list[tuple[str, int]]:
    """A drawn sequence of allocations and frees of live keys."""
    events: list[tuple[str, int]] = []
    live: list[str] = []
    for step in range(draw(st.integers(1, 40))):
        if live and draw(st.booleans()):
            events.append(_free(live.pop(draw(st.integers(0, len(live) - 1)))))
        else:
            live.append(f"t{step}")
            events.append((live[-1], draw(SIZES)))
    return events


def _slack_bound(config: AllocatorConfig, size: int) -> int:
    """The most bytes a block may hold over its rounded request (should_split, get_free_block)."""
    if size <= MIB or config.expandable_segments:
        return 511
    if config.max_split_size is not None and size >= config.max_split_size:
        return config.non_split_rounding - 1
    return MIB


def _check_consistent(allocator: CachingAllocator, requests: dict[str, int]) -> None:
    """The state is one tiling of its segments with nothing in two places, and the counters
    add up from it."""
    segments = allocator.snapshot()
    blocks = [block for segment in segments for block in segment.blocks]
    assert len({block.address for block in blocks}) == len(blocks)
    for segment in segments:
        address = segment.address
        for block in segment.blocks:
            assert block.address == address and block.size > 0
            address += block.size
        assert address == segment.address + segment.size
        pairs = zip(segment.blocks[:-1], segment.blocks[1:], strict=True)
        assert not any(
            not a.allocated and not b.allocated and a.mapped == b.mapped for a, b in pairs
        ), "free neighbours left unmerged"
        assert segment.expandable or all(block.mapped for block in segment.blocks)
    assert allocator.reserved == sum(block.size for block in blocks if block.mapped)
    in_use = [block for block in blocks if block.allocated]
    assert len(in_use) == len(requests)
    assert allocator.allocated == sum(block.size for block in in_use)
    assert allocator.allocated == sum(allocator.block_size(key) for key in requests)
    cached = {(b.size, b.address) for b in blocks if b.mapped and not b.allocated}
    pools = allocator._pools  # the pools' own index of cached blocks agrees with the segments
    assert cached == {key for pool in pools for key in pool.free}
    assert {b.address for b in blocks if not b.mapped} == {a for p in pools for a in p.unmapped}


@settings(max_examples=150)
@given(CONFIGS, _events())
def test_invariants_hold_after_every_event(config, events):
    allocator = CachingAllocator(config)
    requests: dict[str, int] = {}
    reserved = 0
    for key, nbytes in events:
        if nbytes:
            assert allocator.allocate(key, nbytes)
            requests[key] = nbytes
            size = config.round_size(nbytes)
            assert 0 <= allocator.block_size(key) - size <= _slack_bound(config, size)
        else:
            allocator.free(key)
            del requests[key]
        assert allocator.reserved >= allocator.allocated
        assert allocator.reserved % (2 * MIB) == 0
        assert allocator.reserved >= reserved, "nothing is released without a capacity"
        reserved = allocator.reserved
        _check_consistent(allocator, requests)
    assert (
        allocator.peak_reserved == reserved and allocator.peak_reserved >= allocator.peak_allocated
    )
    if config.expandable_segments:
        # one segment per pool, and without releases its mapped pages are one prefix
        assert allocator.segments <= 2
        for segment in allocator.snapshot():
            mapped = [block.mapped for block in segment.blocks]
            assert mapped == sorted(mapped, reverse=True) and mapped.count(False) == 1


@settings(max_examples=100)
@given(CONFIGS, _events(), st.floats(0.3, 1.5))
def test_a_capacity_changes_nothing_until_it_is_reached(config, events, fraction):
    unlimited = simulate(events, config)
    capacity = int(unlimited.peak_reserved * fraction)
    limited = simulate(events, config, capacity=capacity)
    assert limited.peak_reserved <= capacity
    if unlimited.peak_reserved <= capacity:
        assert limited == unlimited
    else:
        # the first cudaMalloc past the capacity fails: something is released or the job fails
        assert not limited.fits or limited.alloc_retries or limited.device_frees


def test_peaks_name_the_events_that_reach_them():
    # a 20 MiB at event 0, b 20 MiB at 1 (allocated peak 40 MiB), both freed, c 30 MiB at 4:
    # no cached block holds it (two separate 20 MiB segments), a new 30 MiB segment: the
    # reserved peak, 70 MiB, is at event 4 while the allocated peak stays at event 1
    events = [("a", 20 * MIB), ("b", 20 * MIB), _free("a"), _free("b"), ("c", 30 * MIB)]
    report = simulate(events)
    assert (report.peak_allocated_event, report.peak_reserved_event) == (1, 4)
    assert (report.peak_reserved, report.reserved, report.allocated) == (70 * MIB,) * 2 + (
        30 * MIB,
    )


GPU_SEQUENCES = {
    "one of each size": [("a", 1), ("b", MIB + 1), ("c", 3 * MIB), ("d", 11 * MIB)],
    "reuse and split": [("a", 12 * MIB), _free("a"), ("b", 4 * MIB), ("c", 8 * MIB)],
    "merge": [("a", 3 * MIB), ("b", 3 * MIB), _free("a"), _free("b"), ("c", 20 * MIB)],
    "batch grows": [("x1", 20 * MIB), ("x2", 20 * MIB), _free("x1"), _free("x2"), ("y", 22 * MIB)],
    "tail best fit": [("x", 6 * MIB), ("y", 10 * MIB), _free("x"), ("z", 4 * MIB), ("w", 5 * MIB)],
    "small then large": [
        *((f"s{i}", 16 * MIB) for i in range(8)),
        *(_free(f"s{i}") for i in range(8)),
        *((f"l{i}", 32 * MIB) for i in range(4)),
    ],
}


@pytest.mark.cuda
@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("name", sorted(GPU_SEQUENCES))
def test_the_model_matches_torchs_allocator_on_a_gpu(name, expandable):
    # Each sequence runs in a pool of its own (torch.cuda.MemPool: nothing else allocates from
    # it); after every event the pool's reserved and allocated bytes (memory_snapshot) equal
    # the model's
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    setting = f"expandable_segments:{expandable}"
    torch.cuda.memory._set_allocator_settings(setting)
    model = CachingAllocator(AllocatorConfig.parse(setting))
    pool, live, seen = torch.cuda.MemPool(), {}, []
    try:
        for key, nbytes in GPU_SEQUENCES[name]:
            if nbytes:
                with torch.cuda.use_mem_pool(pool):
                    live[key] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                model.allocate(key, nbytes)
            else:
                del live[key]
                model.free(key)
            segments = torch.cuda.memory_snapshot(pool.id)
            blocks = [b for s in segments for b in s["blocks"]]
            reserved = sum(s["total_size"] for s in segments)
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            seen.append((key, reserved, allocated, model.reserved, model.allocated))
        assert all(r == mr and a == ma for _, r, a, mr, ma in seen), seen
    finally:
        live.clear()
        del pool
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
        torch.cuda.empty_cache()
