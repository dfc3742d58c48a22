"""Record what a SAC plan is solved over (`solver.sac.SacProblem`) from a model and its inputs.

Steps (`record_problem`):
1. `measure_windows`: one plain training step (forward, loss, backward) under the profiler's
   allocation events, with instants marked where each block's forward starts and ends and where
   the gradient of its output is complete (its backward starts): live and peak bytes of every
   window (solver/sac/problem.py).
2. `record_ops`: the forward again, `repeats` times, under a TorchDispatchMode that sees the ops
   the SAC policy sees (every dispatched op but `SAC_IGNORED_OPS`) and under saved-tensor hooks
   that see what autograd saves: per op its new storage bytes (deduplicated by storage), the last
   op reading it, whether autograd saves it, whether it may be MUST_SAVE, and its median time in
   seconds (measured wall time, not FLOPs: pointwise ops count 0 FLOPs yet take real time on CPU,
   and the objective is step time); then once more under the profiler, each op in a window,
   for its scratch bytes (`_measure_scratch`).
The RNG state and the model's buffers are restored after each run, and `.grad` is left as found.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS

from graph_capture.peak import _allocation_events, _memory_profile
from solver.sac import SacBlock, SacOp, SacProblem, Segment
from solver.sac.memory import plain_forward_live

Step = Callable[[], torch.Tensor]
"""The forward of one training step: returns the scalar loss."""


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tensors(tree: object) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


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


class _Recorder(TorchDispatchMode):
    """Attributes each dispatched op to the block running (`block`, None outside blocks)."""

    def __init__(self, blocks: list[_BlockFacts], first: bool, mark_ops: bool = False) -> None:
        super().__init__()
        self.blocks = blocks
        self.first = first
        self.mark_ops = mark_ops  # each op in a profiler window, in `marked` order
        self.marked: list[tuple[int, int]] = []  # (block, op) of each window
        self.block: int | None = None
        self.position = 0
        self.creator: dict[int, int] = {}  # storage -> op index in the current block

    def enter(self, j: int, inputs: Sequence[torch.Tensor]) -> None:
        self.block, self.position, self.creator = j, 0, {}
        if self.first:
            self.blocks[j].inputs = {_storage(t): t.untyped_storage().nbytes() for t in inputs}

    def leave(self, outputs: Sequence[torch.Tensor]) -> None:
        if not self.first and self.position != len(self.blocks[self.block].ops):
            raise ValueError(
                f"the forward of block {self.block} dispatches {self.position} ops in one run "
                f"and {len(self.blocks[self.block].ops)} in another: SAC cannot plan it"
            )
        if self.first:
            ops = self.blocks[self.block].ops
            for t in outputs:
                if (c := self.creator.get(_storage(t))) is not None:
                    ops[c].last_read = len(ops) - 1
                    ops[c].outputs.add(_storage(t))
        self.block = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.block is not None and self.first:
            facts = self.blocks[self.block]
            facts.stop = self.position - 1
            facts.packed.add(_storage(t))
            if (c := self.creator.get(_storage(t))) is not None:
                facts.ops[c].saved.add(_storage(t))
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
        start = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - start
        facts = self.blocks[self.block]
        i, self.position = self.position, self.position + 1
        if not self.first:
            if i >= len(facts.ops) or facts.ops[i].name != str(func):
                raise ValueError(
                    f"the forward of block {self.block} dispatches {func} at op {i} in one run "
                    "and not in another: its op stream is not deterministic, SAC cannot plan it"
                )
            facts.ops[i].seconds.append(seconds)
            return out
        read = {_storage(t) for t in _tensors((args, kwargs))}
        for s in read:
            if (c := self.creator.get(s)) is not None:
                facts.ops[c].last_read = i
        storages: dict[int, int] = {}
        seen = set()
        for t in _tensors(out):
            s = _storage(t)
            if s in seen:
                continue
            seen.add(s)
            if s in read:
                if func._schema.is_mutable and (c := self.creator.get(s)) is not None:
                    facts.ops[c].mutated = True
            else:  # a new storage, possibly where a freed one was
                self.creator[s] = i
                storages[s] = t.untyped_storage().nbytes()
        random = torch.Tag.nondeterministic_seeded in func.tags
        facts.ops.append(_OpFacts(str(func), i, random, [seconds], storages))
        return out


class _Snapshot:
    """RNG state and buffers taken now, restored by `restore` (recording leaves no trace)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rng = torch.get_rng_state()
        self.buffers = {k: v.clone() for k, v in model.named_buffers()}

    def restore(self) -> None:
        torch.set_rng_state(self.rng)
        with torch.no_grad():
            for k, v in self.model.named_buffers():
                v.copy_(self.buffers[k])


def _hooks(blocks: Sequence[nn.Module], on_enter, on_leave) -> list:
    handles = []
    for j, block in enumerate(blocks):
        handles.append(
            block.register_forward_pre_hook(
                lambda _m, a, k, j=j: on_enter(j, _tensors((a, k))), with_kwargs=True
            )
        )
        handles.append(block.register_forward_hook(lambda _m, _a, o, j=j: on_leave(j, o)))
    return handles


def record_ops(
    model: nn.Module, blocks: Sequence[nn.Module], step: Step, repeats: int
) -> list[_BlockFacts]:
    """Each block's forward op stream over `repeats` forwards (module docstring, step 2)."""
    facts = [_BlockFacts() for _ in blocks]
    snapshot = _Snapshot(model)
    try:
        for run in range(repeats):
            recorder = _Recorder(facts, first=run == 0)
            handles = _hooks(blocks, recorder.enter, lambda _j, o, r=recorder: r.leave(_tensors(o)))
            try:
                with recorder, torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t):
                    loss = step()
                del loss
            finally:
                for h in handles:
                    h.remove()
            snapshot.restore()
        _measure_scratch(model, blocks, step, facts)
    finally:
        snapshot.restore()
    return facts


def _measure_scratch(
    model: nn.Module, blocks: Sequence[nn.Module], step: Step, facts: list[_BlockFacts]
) -> None:
    """Each op's scratch bytes: the most it held at once during its call beyond what it left
    allocated at its end (its outputs), from the profiler's allocation events in a window
    around the call."""
    from graph_capture.peak import window_peaks

    recorder = _Recorder(facts, first=False, mark_ops=True)
    handles = _hooks(blocks, recorder.enter, lambda _j, _o: setattr(recorder, "block", None))
    try:
        with _memory_profile() as prof, recorder:
            loss = step()
            del loss
    finally:
        for h in handles:
            h.remove()
    for (j, i), (peak, end) in zip(
        recorder.marked, window_peaks(prof, "remat.sacop:"), strict=True
    ):
        facts[j].ops[i].scratch = max(facts[j].ops[i].scratch, peak - end)


@dataclass(frozen=True)
class _Windows:
    f_start: list[int]
    f_peak: list[int]
    b_start: list[int]
    b_peak: list[int]
    segments: list[Segment]
    peak: int


def measure_windows(model: nn.Module, blocks: Sequence[nn.Module], step: Step) -> _Windows:
    """The plain step's live and peak bytes per window (module docstring, step 1)."""
    from torch._C._profiler import _RecordFunctionFast

    marks: list[str] = []

    def mark(label: str) -> None:
        with _RecordFunctionFast(f"remat.sac:{len(marks)}"):
            marks.append(label)

    def on_leave(j: int, out: object) -> None:
        mark(f"fe{j}")
        fired = []

        def hook(grad: torch.Tensor) -> None:
            if not fired:
                fired.append(True)
                mark(f"bs{j}")

        for t in _tensors(out):
            if t.requires_grad:
                t.register_hook(hook)

    snapshot = _Snapshot(model)
    grads = {p: p.grad for p in model.parameters()}
    model.zero_grad(set_to_none=True)
    handles = _hooks(blocks, lambda j, _i: mark(f"fs{j}"), on_leave)
    try:
        with _memory_profile() as prof:
            step().backward()
    finally:
        for h in handles:
            h.remove()
        snapshot.restore()
        for p, g in grads.items():
            p.grad = g
    return _cut(prof, marks, len(blocks))


def _cut(prof, marks: list[str], n: int) -> _Windows:
    """Live bytes at each mark and the peak of each stretch between consecutive marks."""
    from graph_capture.peak import _windows

    times = [start for start, _ in _windows(prof, "remat.sac:")]  # in the order of `marks`
    order = [f"{k}{j}" for j in range(n) for k in ("fs", "fe")]
    order += [f"bs{j}" for j in reversed(range(n))]
    if marks != order:
        raise ValueError(
            "each block must run its forward once per step, in order and not nested, and "
            f"return a tensor that requires grad; the step ran {marks}"
        )
    events = _allocation_events(prof)
    live = peak = 0
    starts: list[int] = []  # live bytes at each mark
    peaks: list[int] = []  # peak of the stretch before each mark, then the one after the last
    k = 0
    for t in times:
        while k < len(events) and events[k][0] < t:
            live += events[k][1]
            peak = max(peak, live)
            k += 1
        before = live
        # an event stamped with the mark's own time may fall on either side: count it on both
        while k < len(events) and events[k][0] == t:
            live += events[k][1]
            peak = max(peak, live)
            k += 1
        peaks.append(peak)
        starts.append(max(before, live))
        peak = max(before, live)
    for _, size in events[k:]:
        live += size
        peak = max(peak, live)
    peaks.append(peak)
    at = {label: m for m, label in enumerate(order)}
    after = peaks[1:]  # the stretch that starts at mark m
    segments = [Segment(peaks[0], 0)]
    segments += [Segment(after[at[f"fe{j}"]], j + 1) for j in range(n)]
    return _Windows(
        f_start=[starts[at[f"fs{j}"]] for j in range(n)],
        f_peak=[after[at[f"fs{j}"]] for j in range(n)],
        b_start=[starts[at[f"bs{j}"]] for j in range(n)],
        b_peak=[after[at[f"bs{j}"]] for j in range(n)],
        segments=segments,
        peak=max(peaks),
    )


def in_call_order(
    model: nn.Module, named: Sequence[tuple[str, nn.Module]], step: Step
) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs in the order a forward (without grad) first calls them; those
    it never calls are left out."""
    first: dict[int, int] = {}

    def called(k: int) -> None:  # a pre-hook returning a value would replace the inputs
        first.setdefault(k, len(first))

    handles = [
        m.register_forward_pre_hook(lambda _m, _a, k=k: called(k)) for k, (_, m) in enumerate(named)
    ]
    snapshot = _Snapshot(model)
    try:
        with torch.no_grad():
            step()
    finally:
        for h in handles:
            h.remove()
        snapshot.restore()
    return [named[k] for k in sorted(first, key=first.__getitem__)]


def rng_state_bytes() -> int:
    """Bytes of the CPU RNG state a checkpoint keeps from its forward to its backward
    (`preserve_rng_state=True`, the default)."""
    return torch.get_rng_state().untyped_storage().nbytes()


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


def record_problem(
    model: nn.Module,
    blocks: Sequence[tuple[str, nn.Module]],
    step: Step,
    repeats: int = 3,
) -> SacProblem:
    """The SacProblem of `model`'s step over `blocks` (name, module), in forward order."""
    modules = [m for _, m in blocks]
    windows = measure_windows(model, modules, step)
    facts = record_ops(model, modules, step, repeats)
    params = {_storage(p) for p in model.parameters()}
    out = []
    for j, ((name, _), f) in enumerate(zip(blocks, facts, strict=True)):
        ops = tuple(_op(o) for o in f.ops)
        held_extra = rng_state_bytes() + sum(
            nbytes for s, nbytes in f.inputs.items() if s not in f.packed and s not in params
        )
        block = SacBlock(
            name,
            ops,
            f.stop,
            held_extra,
            0,
            windows.f_start[j],
            windows.f_peak[j],
            windows.b_start[j],
            windows.b_peak[j],
        )
        modelled = max((plain_forward_live(block, t) for t in range(len(ops))), default=0)
        workspace = max(0, windows.f_peak[j] - windows.f_start[j] - modelled)
        out.append(replace(block, workspace=workspace, recompute_extra=rng_state_bytes()))
    return SacProblem(tuple(out), tuple(windows.segments), windows.peak)
