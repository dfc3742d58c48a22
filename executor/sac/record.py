"""Record what a SAC plan is solved over (`solver.sac.SacUnion`) from a model and its inputs.

Steps (`record_union`):
1. `measure_windows` (`executor.sac.windows`): one plain training step (forward, loss,
   backward) under the profiler's allocation events, with instants marked where each block's
   forward starts and ends and where the gradient of its output is complete (its backward
   starts), and the same for each block's children: live and peak bytes of every window
   (solver/sac/problem.py). A block's children are a split (solver/sac/union.py) only where
   their marks nest in the block's in order: each child runs its forward once, after the
   previous one, and its output's gradient completes before the previous child's (a child
   called twice, such as one ReLU module used twice, or an in-place child whose output is its
   input, is not).
2. `record_ops`: for the blocks, then for the split blocks' children: the forward again,
   `repeats` times, under a TorchDispatchMode that sees the ops the SAC policy sees (every
   dispatched op but `SAC_IGNORED_OPS`) and under saved-tensor hooks that see what autograd
   saves: per op its new storage bytes (deduplicated by storage), the last op reading it,
   whether autograd saves it, whether it may be MUST_SAVE, and its median wall time (pointwise
   ops count 0 FLOPs yet take real time on CPU); then once more under the profiler, each op in
   a window, for its scratch bytes (`_measure_scratch`).
3. `measure_overhead` (`executor.sac.overhead`): per region, the seconds its SAC policy costs
   beyond plain checkpoint, and plain checkpoint beyond none; the latter less the recorded
   seconds of the ops a full recompute reruns is the region's `price` (where it is less, those
   seconds are scaled down to it instead: `overhead.priced`).
In estimate mode (no noise), each region's kind is taken first, with its inputs, from one
forward (`executor.sac.alike`), and step 2 records the first region of each kind only, its
forward ending after the last of them, the others of a kind taking its facts.
The RNG state and the model's buffers are restored after each run, and `.grad` is left as found.
Bytes and seconds come from a measurer (`executor.sac.measurer`): measured as above, or in
estimate mode predicted for a target from a fake step (`executor.sac.estimate`: scratch is the
target's workspace model).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS

from executor.errors import PlanError
from executor.sac.alike import region_kinds
from executor.sac.measurer import Measured, storage_key
from executor.sac.overhead import RegionTimes, Stream, measure_overhead, pooled, priced
from executor.sac.region import buffer_state, cache_off_hooks, mutated_buffers
from executor.sac.step import RecordingTime, Snapshot, Step, hooked, leaf_tensors
from executor.sac.windows import measure_windows
from graph_capture.measurement.peak import memory_profile
from solver.sac import SacBlock, SacOp, SacProblem
from solver.sac.memory import plain_forward_live
from solver.sac.union import SacSplit, SacUnion
from solver.sac.windows import Windows


@dataclass
class _OpFacts:
    name: str
    last_read: int
    random: bool
    seconds: list[float] = field(default_factory=list)
    storages: dict[int, int] = field(default_factory=dict)  # new storage -> bytes
    saved: set[int] = field(default_factory=set)  # of those, the ones autograd saves
    outputs: set[int] = field(default_factory=set)  # and the block's outputs
    mutated: bool = False
    scratch: int = 0


@dataclass
class _BlockFacts:
    ops: list[_OpFacts] = field(default_factory=list)
    stop: int = -1
    inputs: dict[int, int] = field(default_factory=dict)  # storage -> bytes
    packed: set[int] = field(default_factory=set)  # storages autograd saved
    buffers: dict[str, int] = field(default_factory=dict)  # mutated buffer -> bytes


class _Recorder(TorchDispatchMode):
    """Attributes each dispatched op to the block running (`block`, None outside blocks)."""

    def __init__(
        self, blocks: list[_BlockFacts], first: bool, measurer: Measured, mark_ops: bool = False
    ) -> None:
        super().__init__()
        self.blocks = blocks
        self.measurer = measurer
        self.first = first
        self.mark_ops = mark_ops  # each op in a profiler window, in `marked` order
        self.marked: list[tuple[int, int]] = []  # (block, op) of each window
        self.block: int | None = None
        self.position = 0
        self.creator: dict[int, int] = {}  # storage -> op index in the current block

    def enter(self, j: int, inputs: Sequence[torch.Tensor]) -> None:
        self.block, self.position, self.creator = j, 0, {}
        if self.first:
            self.blocks[j].inputs = {storage_key(t): self.measurer.nbytes(t) for t in inputs}

    def leave(self, outputs: Sequence[torch.Tensor]) -> None:
        if not self.first and self.position != len(self.blocks[self.block].ops):
            raise PlanError(
                f"the forward of block {self.block} dispatches {self.position} ops in one run "
                f"and {len(self.blocks[self.block].ops)} in another: SAC cannot plan it"
            )
        if self.first:
            ops = self.blocks[self.block].ops
            for t in outputs:
                if (c := self.creator.get(storage_key(t))) is not None:
                    ops[c].last_read = len(ops) - 1
                    ops[c].outputs.add(storage_key(t))
        self.block = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.block is not None and self.first:
            facts = self.blocks[self.block]
            facts.stop = self.position - 1
            facts.packed.add(storage_key(t))
            if (c := self.creator.get(storage_key(t))) is not None:
                facts.ops[c].saved.add(storage_key(t))
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS or self.block is None:
            return func(*args, **kwargs)
        if self.mark_ops:
            from torch._C._profiler import _RecordFunctionFast

            self.marked.append((self.block, self.position))
            with _RecordFunctionFast(f"remat.sacop:{len(self.marked) - 1}"):
                out = func(*args, **kwargs)
            self.position += 1
            return out
        out, seconds = self.measurer.call(func, args, kwargs)
        facts = self.blocks[self.block]
        i, self.position = self.position, self.position + 1
        if not self.first:
            if i >= len(facts.ops) or facts.ops[i].name != str(func):
                raise PlanError(
                    f"the forward of block {self.block} dispatches {func} at op {i} in one run "
                    "and not in another: its op stream is not deterministic, SAC cannot plan it"
                )
            facts.ops[i].seconds.append(seconds)
            return out
        read = {storage_key(t) for t in leaf_tensors((args, kwargs))}
        for s in read:
            if (c := self.creator.get(s)) is not None:
                facts.ops[c].last_read = i
        storages: dict[int, int] = {}
        seen = set()
        for t in leaf_tensors(out):
            s = storage_key(t)
            if s in seen:
                continue
            seen.add(s)
            if s in read:
                if func._schema.is_mutable and (c := self.creator.get(s)) is not None:
                    facts.ops[c].mutated = True
            else:  # a new storage, possibly where a freed one was
                self.creator[s] = i
                storages[s] = self.measurer.nbytes(t)
        random = torch.Tag.nondeterministic_seeded in func.tags
        scratch = self.measurer.scratch(func, args, kwargs, out)
        facts.ops.append(_OpFacts(str(func), i, random, [seconds], storages, scratch=scratch))
        return out


def _hooks(blocks: Sequence[nn.Module], on_enter, on_leave) -> list:
    handles = []
    for j, block in enumerate(blocks):
        handles.append(
            block.register_forward_pre_hook(
                lambda _m, a, k, j=j: on_enter(j, leaf_tensors((a, k))), with_kwargs=True
            )
        )
        handles.append(block.register_forward_hook(lambda _m, _a, o, j=j: on_leave(j, o)))
    return handles


def _buffer_hooks(
    blocks: Sequence[nn.Module], facts: list[_BlockFacts], measurer: Measured
) -> list:
    """Hooks recording, per block, the buffers its forward mutates and their bytes; registered
    after `_hooks`, they run outside the recorder's block (the pre-hook first, the hook last),
    so their copies and comparisons are not ops of the block."""
    before: dict[int, dict] = {}

    def leave(j: int, block: nn.Module) -> None:
        named = dict(block.named_buffers())
        for n in mutated_buffers(block, before.pop(j), measurer.changed):
            facts[j].buffers[n] = measurer.nbytes(named[n])

    handles = []
    for j, block in enumerate(blocks):
        handles.append(
            block.register_forward_pre_hook(
                lambda m, _a, j=j: before.__setitem__(j, buffer_state(m)), prepend=True
            )
        )
        handles.append(block.register_forward_hook(lambda m, _a, _o, j=j: leave(j, m)))
    return handles


class _Recorded(Exception):
    """The blocks to record have run: the rest of the forward is not needed."""


def _end_forward(_module: nn.Module, _args, _out) -> None:
    raise _Recorded


def _record_alike(model, modules, step: Step, runs, measurer, kinds) -> list[_BlockFacts]:
    """`record_ops` over `modules` (in call order); with `kinds` (executor/sac/alike.py), of
    the first module of each kind only, the forward ending after the last of them, each
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


def record_ops(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    step: Step,
    runs: Iterable[int] = range(3),
    measurer: Measured | None = None,
    whole: bool = True,
) -> list[_BlockFacts]:
    """Each block's forward op stream over the forwards `runs` (0, 1, ...; module docstring,
    step 2), its bytes and seconds from `measurer` (default `Measured`); `whole=False`: each
    forward ends where the last of `blocks` (in call order) returns."""
    measurer = measurer or Measured()
    facts = [_BlockFacts() for _ in blocks]
    snapshot = Snapshot(model)
    try:
        for run in runs:
            recorder = _Recorder(facts, run == 0, measurer)
            handles = _hooks(
                blocks, recorder.enter, lambda _j, o, r=recorder: r.leave(leaf_tensors(o))
            )
            if run == 0:
                handles += _buffer_hooks(blocks, facts, measurer)
            if not whole:
                handles.append(blocks[-1].register_forward_hook(_end_forward))
            saves = torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t)
            with hooked(handles), recorder, saves, contextlib.suppress(_Recorded):
                step()
            snapshot.restore()
        if measurer.measures_scratch:
            _measure_scratch(model, blocks, step, facts, measurer)
    finally:
        snapshot.restore()
    return facts


def _measure_scratch(model, blocks, step: Step, facts: list[_BlockFacts], measurer) -> None:
    """Each op's scratch bytes: the most it held at once during its call beyond what it left
    allocated at its end (its outputs), from the profiler's allocation events in a window
    around the call."""
    from graph_capture.measurement.peak import window_peaks

    recorder = _Recorder(facts, False, measurer, mark_ops=True)
    handles = _hooks(blocks, recorder.enter, lambda _j, _o: setattr(recorder, "block", None))
    with hooked(handles), memory_profile() as prof, recorder:
        loss = step()
        del loss
    for (j, i), (peak, end) in zip(
        recorder.marked, window_peaks(prof, "remat.sacop:"), strict=True
    ):
        facts[j].ops[i].scratch = max(facts[j].ops[i].scratch, peak - end)


RECORDING_STEPS = {"eager": 1, "order": 1, "windows": 2, "ops": 3, "prices": 7}
"""Plain steps' worth of each part of a recording at one run per measurement (`RecordingTime`):
a plain step, a forward finding the call order (per set of regions), the profiled step of the
windows, an op-stream recording (a forward with a backward, then one under the profiler), the
prices of a set of regions (their inputs, then each region alone six times). Estimates, for
the time a recording needs."""


def _op(o: _OpFacts) -> SacOp:
    """The torch-free op: bytes per kind of storage, the median of its measured seconds."""
    new_bytes = sum(o.storages.values())
    return SacOp(
        name=o.name,
        new_bytes=new_bytes,
        seconds=statistics.median(o.seconds),
        last_read=o.last_read,
        saved_bytes=sum(o.storages[s] for s in o.saved - o.outputs),
        saveable=new_bytes > 0 and not o.mutated and not o.random,
        scratch=o.scratch,
        output_bytes=sum(o.storages[s] for s in o.outputs),
    )


def _block(
    name: str,
    f: _BlockFacts,
    window: tuple[int, int, int, int],
    params: set[int],
    rng_bytes: int,
):
    """The torch-free block of recorded facts and its plain windows (f_start, f_peak, b_start,
    b_peak), its `workspace` the plain forward's measured peak beyond the op-level model;
    `rng_bytes` the RNG state a checkpoint keeps (`Measured.rng_state_bytes`)."""
    ops = tuple(_op(o) for o in f.ops)
    copies = sum(f.buffers.values())  # the mutated buffers' values from before the forward
    held_extra = (
        rng_bytes
        + copies
        + sum(nbytes for s, nbytes in f.inputs.items() if s not in f.packed and s not in params)
    )
    block = SacBlock(name, ops, f.stop, held_extra, 0, *window, buffers=tuple(sorted(f.buffers)))
    modelled = max((plain_forward_live(block, t) for t in range(len(ops))), default=0)
    workspace = max(0, window[1] - window[0] - modelled)
    return replace(block, workspace=workspace, recompute_extra=rng_bytes + copies)


def record_union(
    model: nn.Module,
    blocks: Sequence[tuple[str, nn.Module]],
    children: Sequence[Sequence[tuple[str, nn.Module]] | None],
    step: Step,
    repeats: int = 3,
    clock: RecordingTime | None = None,
    measurer: Measured | None = None,
) -> tuple[SacUnion, list[list[tuple[str, nn.Module]] | None]]:
    """The SacUnion of `model`'s step over `blocks` (name, module), in forward order, split
    into `children` (per block, its children in call order, or None) where those run once
    each, in sequence; with the children kept per block (None where the block is not split).
    Every candidate region runs with its arguments as under checkpoint (`cache_off`). Each
    op stream is recorded `repeats` times and each region's prices over 5 rounds, fewer where
    `clock` leaves no time for more (a third of its spare time to the blocks' op streams,
    half the rest to the children's, the rest to the prices); `clock` raises PlanError once
    its deadline has passed (`RecordingTime`). `measurer` (default `Measured`) gives the bytes
    and seconds: measured, or in estimate mode predicted (executor/sac/estimate.py), where one
    run of each measurement suffices."""
    measurer = measurer or Measured()
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
    5. `_block` per block, priced, and `_splits`: the kept children as torch-free blocks

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
        out.append(priced(_block(name, f, window, params, rng_bytes), overheads[j]))
    splits, kept = _splits(kept, windows, flat_facts, overheads[len(blocks) :], params, rng_bytes)
    basis = "measured" if measurer.target is None else "predicted"
    problem = SacProblem(tuple(out), tuple(windows.segments), windows.peak, basis)
    return SacUnion(problem, tuple(splits)), kept


def _op_streams(
    model: nn.Module,
    modules: list[nn.Module],
    kids: list[nn.Module],
    step: Step,
    repeats: int,
    clock: RecordingTime,
    measurer: Measured,
    kinds: list | None,
) -> tuple[list[_BlockFacts], list[_BlockFacts]]:
    """The recorded facts of the blocks' (`modules`) op streams, then of the kept children's
    (`kids`, none recorded where there are none), each up to `repeats` runs within `clock`'s
    spare time (a third of it to the blocks, half the rest to the children); `kinds` (per
    region, blocks first; None: every region recorded) records each kind once."""
    runs = clock.repeats(repeats, clock.spare.share(1 / 3))
    alike = None if kinds is None else kinds[: len(modules)]
    facts = _record_alike(model, modules, step, runs, measurer, alike)
    clock.finished("the blocks' op streams", RECORDING_STEPS["ops"])
    if not kids:
        return facts, []
    runs = clock.repeats(repeats, clock.spare.share(1 / 2))
    alike = None if kinds is None else kinds[len(modules) :]
    kid_facts = _record_alike(model, kids, step, runs, measurer, alike)
    clock.finished("the children's op streams", RECORDING_STEPS["ops"])
    return facts, kid_facts


def _prices(
    model: nn.Module,
    regions: list[nn.Module],
    block_names: list[str],
    facts: list[_BlockFacts],
    step: Step,
    clock: RecordingTime,
    measurer: Measured,
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
    kid_facts: list[_BlockFacts],
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
            priced(_block(n, next(facts), w, params, rng_bytes), next(overheads))
            for (n, _), w in zip(kids, windows.splits[j], strict=True)
        ]
        if any(child is None for child in made):
            kept[j] = None
            splits.append(None)
            continue
        splits.append(SacSplit(tuple(made), tuple(windows.inner[j])))
    return splits, kept
