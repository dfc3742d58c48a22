"""Record what a SAC plan is solved over (`solver.sac.SacUnion`) from a model and its inputs.

Steps (`record_union`):
1. `measure_windows` (`executor.sac.recording.windows`): one plain training step (forward, loss,
   backward) under the profiler's allocation events, with instants marked where each block's
   forward starts and ends and where the gradient of its output is complete (its backward
   starts), and the same for each block's children: live and peak bytes of every window
   (solver/sac/problem.py). A block's children are a split (solver/sac/union.py) only where
   their marks nest in the block's in order: each child runs its forward once, after the
   previous one, and its output's gradient completes before the previous child's (a child
   called twice, such as one ReLU module used twice, or an in-place child whose output is its
   input, is not).
2. `record_ops` (`executor.sac.recording.op_streams`): for the blocks, then for the split blocks'
   children: the forward again, `repeats` times, under a TorchDispatchMode that sees the ops
   the SAC policy sees and under saved-tensor hooks that see what autograd saves: per op its
   new storage bytes, the last op reading it, whether autograd saves it, whether it may be
   MUST_SAVE, its wall time and, once more under the profiler, its scratch bytes; `sac_block`
   (`executor.sac.recording.facts`) makes a block's facts a torch-free block, each op's seconds the
   median of its runs.
3. `measure_overhead` (`executor.sac.recording.overhead`): per region, the seconds its SAC policy
   costs beyond plain checkpoint, and plain checkpoint beyond none; the latter less the recorded
   seconds of the ops a full recompute reruns is the region's `price` (where it is less, those
   seconds are scaled down to it instead: `overhead.priced`).
In estimate mode (no noise), each region's kind is taken first, with its inputs, from one
forward (`executor.sac.recording.alike`), and step 2 records the first region of each kind only, its
forward ending after the last of them, the others of a kind taking its facts.
The RNG state and the model's buffers are restored after each run, and `.grad` is left as found.
Bytes and seconds come from a measurer (`executor.sac.recording.measurer`): measured as above, or in
estimate mode predicted for a target from a fake step (`executor.sac.recording.estimate`: scratch
is the target's workspace model).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from torch import nn

from executor.errors import PlanError
from executor.sac.recording.alike import region_kinds
from executor.sac.recording.facts import BlockFacts, sac_block
from executor.sac.recording.measurer import Measurer, storage_key
from executor.sac.recording.op_streams import record_ops
from executor.sac.recording.overhead import Stream, measure_overhead, pooled, priced
from executor.sac.recording.region_timing import RegionTimes
from executor.sac.recording.windows import measure_windows
from executor.sac.runtime.region import cache_off_hooks
from executor.sac.step import LossClosure, RecordingTime, hooked
from solver.sac import SacProblem
from solver.sac.union import SacSplit, SacUnion
from solver.sac.windows import Windows


def _record_alike(model, modules, step: LossClosure, runs, measurer, kinds) -> list[BlockFacts]:
    """`record_ops` over `modules` (in call order); with `kinds` (executor/sac/recording/alike.py),
    of the first module of each kind only, the forward ending after the last of them, each
    other module given the facts of the first of its kind."""
    if kinds is None:
        return record_ops(model, modules, step, runs, measurer)
    first: dict = {}
    for j, kind in enumerate(kinds):
        first.setdefault(kind, j)
    picked = sorted(first.values())
    facts = record_ops(model, [modules[j] for j in picked], step, runs, measurer, whole=False)
    recorded = dict(zip(picked, facts, strict=True))
    return [recorded[first[kind]] for kind in kinds]


RECORDING_STEPS = {"eager": 1, "order": 1, "windows": 2, "ops": 3, "prices": 7}
"""Plain steps' worth of each part of a recording at one run per measurement (`RecordingTime`):
a plain step, a forward finding the call order (per set of regions), the profiled step of the
windows, an op-stream recording (a forward with a backward, then one under the profiler), the
prices of a set of regions (their inputs, then each region alone six times). Estimates, for
the time a recording needs."""


def record_union(
    model: nn.Module,
    blocks: Sequence[tuple[str, nn.Module]],
    children: Sequence[Sequence[tuple[str, nn.Module]] | None],
    step: LossClosure,
    repeats: int = 3,
    clock: RecordingTime | None = None,
    measurer: Measurer | None = None,
) -> tuple[SacUnion, list[list[tuple[str, nn.Module]] | None]]:
    """The SacUnion of `model`'s step over `blocks` (name, module), in forward order, split
    into `children` (per block, its children in call order, or None) where those run once
    each, in sequence; with the children kept per block (None where the block is not split).
    Every candidate region runs with its arguments as under checkpoint (`cache_off`). Each
    op stream is recorded `repeats` times and each region's prices over 5 rounds, fewer where
    `clock` leaves no time for more (a third of its spare time to the blocks' op streams,
    half the rest to the children's, the rest to the prices); `clock` raises PlanError once
    its deadline has passed (`RecordingTime`). `measurer` (default `Measurer`) gives the bytes
    and seconds: measured, or in estimate mode predicted (executor/sac/recording/estimate.py),
    where one run of each measurement suffices."""
    measurer = measurer or Measurer()
    repeats = measurer.repeats(repeats)
    candidates = [m for _, m in blocks] + [m for kids in children for _, m in kids or ()]
    with hooked(cache_off_hooks(candidates)):
        return _record_union(
            model, blocks, children, step, repeats, clock or RecordingTime(), measurer
        )


def _record_union(model, blocks, children, step, repeats, clock: RecordingTime, measurer):
    """`record_union` under its cache-off hooks, in order (the module docstring's steps):

    1. `measure_windows`: the plain step's memory windows of the blocks and of their children;
       a block's children are kept where they split it (each runs once, in sequence)
    2. `region_kinds` (a measurer that records alike regions once): each region's inputs and
       kind, from one forward
    3. `_op_streams`: the blocks' op streams, then the kept children's
    4. `_prices`: each region's SAC overhead and plain checkpoint's price
    5. `sac_block` per block, priced, and `_splits`: the kept children as torch-free blocks

    then the `SacUnion` (its bytes' basis "measured" or, with a target, "predicted") and the
    children kept per block (None where the block is not split).
    """
    modules = [m for _, m in blocks]
    windows = measure_windows(
        model,
        modules,
        step,
        [None if k is None else [m for _, m in k] for k in children],
        measurer,
    )
    clock.finished("the memory windows", RECORDING_STEPS["windows"])
    kept = [
        None if split is None else list(kids)
        for split, kids in zip(windows.splits, children, strict=True)
    ]
    flat = [kid for kids in kept if kids is not None for kid in kids]
    regions = modules + [m for _, m in flat]
    calls = kinds = None
    if measurer.records_alike:
        calls, kinds = region_kinds(model, regions, step)
    facts, flat_facts = _op_streams(
        model, modules, [m for _, m in flat], step, repeats, clock, measurer, kinds
    )
    names = [name for name, _ in blocks]
    overheads = _prices(model, regions, names, facts + flat_facts, step, clock, measurer, calls)
    params = {storage_key(p) for p in model.parameters()}
    rng_bytes = measurer.rng_state_bytes()
    out = []
    for j, (name, f) in enumerate(zip(names, facts, strict=True)):
        window = (windows.f_start[j], windows.f_peak[j], windows.b_start[j], windows.b_peak[j])
        out.append(priced(sac_block(name, f, window, params, rng_bytes), overheads[j]))
    splits, kept = _splits(kept, windows, flat_facts, overheads[len(blocks) :], params, rng_bytes)
    basis = "measured" if measurer.target is None else "predicted"
    problem = SacProblem(
        tuple(out),
        tuple(windows.segments),
        windows.peak,
        basis,
        backward_start=windows.backward_start,
        root_b_start=windows.root_b_start,
        root_b_peak=windows.root_b_peak,
        end=windows.end,
        largest=windows.largest,
    )
    return SacUnion(problem, tuple(splits)), kept


def _op_streams(
    model: nn.Module,
    modules: list[nn.Module],
    kids: list[nn.Module],
    step: LossClosure,
    repeats: int,
    clock: RecordingTime,
    measurer: Measurer,
    kinds: list | None,
) -> tuple[list[BlockFacts], list[BlockFacts]]:
    """The recorded facts of the blocks' (`modules`) op streams, then of the kept children's
    (`kids`, none recorded where there are none), each up to `repeats` runs within `clock`'s
    spare time (`SacShares.block_streams` of it to the blocks, `child_streams` of the rest to
    the children); `kinds` (per
    region, blocks first; None: every region recorded) records each kind once."""
    runs = clock.repeats(repeats, clock.spare.share(clock.shares.block_streams))
    alike = None if kinds is None else kinds[: len(modules)]
    facts = _record_alike(model, modules, step, runs, measurer, alike)
    clock.finished("the blocks' op streams", RECORDING_STEPS["ops"])
    if not kids:
        return facts, []
    runs = clock.repeats(repeats, clock.spare.share(clock.shares.child_streams))
    alike = None if kinds is None else kinds[len(modules) :]
    kid_facts = _record_alike(model, kids, step, runs, measurer, alike)
    clock.finished("the children's op streams", RECORDING_STEPS["ops"])
    return facts, kid_facts


def _prices(
    model: nn.Module,
    regions: list[nn.Module],
    block_names: list[str],
    facts: list[BlockFacts],
    step: LossClosure,
    clock: RecordingTime,
    measurer: Measurer,
    calls: list | None,
) -> list[RegionTimes | RuntimeError]:
    """Per region (the blocks, named `block_names`, then the kept children), the seconds its
    SAC policy and plain checkpoint cost (`measure_overhead` on its recorded op stream, `facts`;
    `calls`: the regions' inputs from `region_kinds`, or None), each checkpoint price pooled
    over regions of one kind (`pooled`); a child's error is kept (it cannot be a region).
    PlanError where a block fails inside checkpoint."""
    streams = [
        Stream(
            tuple(o.name for o in f.ops), tuple(statistics.median(o.seconds) for o in f.ops), f.stop
        )
        for f in facts
    ]
    overheads = pooled(
        measure_overhead(
            model, regions, streams, step, clock=clock, measurer=measurer, calls=calls
        ),
        [(type(m), s.ops) for m, s in zip(regions, streams, strict=True)],
    )
    with_children = len(regions) > len(block_names)
    clock.finished("the regions' prices", RECORDING_STEPS["prices"] * (1 + with_children))
    for name, times in zip(block_names, overheads, strict=False):
        if isinstance(times, RuntimeError):
            raise PlanError(
                f"block {name} fails inside torch.utils.checkpoint (run alone, forward and "
                f"backward: {type(times).__name__}: {times}): it cannot be a checkpoint region; "
                "choose other blocks"
            ) from times
    return overheads


def _splits(
    kept: list[list[tuple[str, nn.Module]] | None],
    windows: Windows,
    kid_facts: list[BlockFacts],
    kid_overheads: list[RegionTimes | RuntimeError],
    params: set[int],
    rng_bytes: int,
) -> tuple[list[SacSplit | None], list[list[tuple[str, nn.Module]] | None]]:
    """Per block, its kept children (`kept`, with their recorded facts and prices in the same
    order, flat) as a `SacSplit` of priced blocks and the block's stretches outside them, or
    None; and the children kept after that: None also where a child cannot be a checkpoint
    region (it fails inside checkpoint), as the block then has no split."""
    facts, overheads = iter(kid_facts), iter(kid_overheads)
    splits: list[SacSplit | None] = []
    kept = list(kept)
    for j, kids in enumerate(kept):
        if kids is None:
            splits.append(None)
            continue
        made = [
            priced(sac_block(n, next(facts), w, params, rng_bytes), next(overheads))
            for (n, _), w in zip(kids, windows.splits[j], strict=True)
        ]
        if any(child is None for child in made):
            kept[j] = None
            splits.append(None)
            continue
        splits.append(SacSplit(tuple(made), tuple(windows.inner[j])))
    return splits, kept
