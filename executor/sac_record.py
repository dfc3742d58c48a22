"""Record what a SAC plan is solved over (`solver.sac.SacUnion`) from a model and its inputs.

Steps (`record_union`):
1. `measure_windows`: one plain training step (forward, loss, backward) under the profiler's
   allocation events, with instants marked where each block's forward starts and ends and where
   the gradient of its output is complete (its backward starts), and the same for each block's
   children: live and peak bytes of every window (solver/sac/problem.py). A block's children
   are a split (solver/sac/union.py) only where their marks nest in the block's in order: each
   child runs its forward once, after the previous one, and its output's gradient completes
   before the previous child's (a child called twice, such as one ReLU module used twice, or
   an in-place child whose output is its input, is not).
2. `record_ops`: for the blocks, then for the split blocks' children: the forward again,
   `repeats` times, under a TorchDispatchMode that sees the ops the SAC policy sees (every
   dispatched op but `SAC_IGNORED_OPS`) and under saved-tensor hooks that see what autograd
   saves: per op its new storage bytes (deduplicated by storage), the last op reading it,
   whether autograd saves it, whether it may be MUST_SAVE, and its median time in seconds
   (measured wall time, not FLOPs: pointwise ops count 0 FLOPs yet take real time on CPU, and
   the objective is step time); then once more under the profiler, each op in a window, for its
   scratch bytes (`_measure_scratch`).
The RNG state and the model's buffers are restored after each run, and `.grad` is left as found.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS, checkpoint

from executor.sac_policy import Policy
from graph_capture.peak import _allocation_events, _memory_profile
from solver.sac import SacBlock, SacOp, SacProblem, Segment
from solver.sac.memory import plain_forward_live
from solver.sac.union import SacSplit, SacUnion

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


def _region_inputs(model: nn.Module, regions: Sequence[nn.Module], step: Step) -> list:
    """Per region, the (args, kwargs) it is called with in one forward of the step: tensors
    detached and cloned, each with its `requires_grad`."""
    calls: list = [None] * len(regions)

    def keep(j: int, args, kwargs) -> None:
        if calls[j] is None:
            calls[j] = pytree.tree_map_only(
                torch.Tensor,
                lambda t: t.detach().clone().requires_grad_(t.requires_grad),
                (args, kwargs),
            )

    handles = [
        m.register_forward_pre_hook(lambda _m, a, k, j=j: keep(j, a, k), with_kwargs=True)
        for j, m in enumerate(regions)
    ]
    snapshot = _Snapshot(model)
    try:
        loss = step()
        del loss
    finally:
        for h in handles:
            h.remove()
        snapshot.restore()
    return calls


def _region_step(module: nn.Module, call, policy: Policy | None) -> float:
    """Seconds of one forward and backward of the region alone inside `checkpoint(
    use_reentrant=False)`, under `policy` (None: plain checkpoint); the backward reruns it."""
    args, kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: t.clone() if t.requires_grad else t, call
    )  # a non-leaf copy: the region may write its inputs in place
    for p in module.parameters():
        p.grad = None
    forward = type(module).forward.__get__(module)
    extra = {} if policy is None else {"context_fn": policy.contexts}
    start = time.perf_counter()
    out = checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)
    if policy is not None:
        policy.check_complete()
    outs = [t for t in _tensors(out) if t.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return time.perf_counter() - start


def _paired_overhead(module: nn.Module, call, name: str, ops: Sequence[str], repeats: int) -> float:
    """Median over `repeats` pairs of the region's step under its all-recompute policy minus
    its step under plain checkpoint (seconds, at least 0), after one warm-up of each."""

    def sac() -> float:
        return _region_step(module, call, Policy(name, ops, frozenset()))

    def plain() -> float:
        return _region_step(module, call, None)

    sac(), plain()
    differences = []
    for r in range(repeats):
        if r % 2:
            with_policy, without = sac(), plain()
        else:
            without, with_policy = plain(), sac()
        differences.append(with_policy - without)
    return max(0.0, statistics.median(differences))


def measure_overhead(
    model: nn.Module,
    regions: Sequence[nn.Module],
    ops: Sequence[Sequence[str]],
    step: Step,
    repeats: int = 5,
) -> list[float | None]:
    """Per region, the seconds a training step pays for running it under a SAC policy rather
    than under plain checkpoint: the policy's dispatch modes in its forward and its recompute
    and the op-stream check (`executor.sac_policy.Policy`, recomputing every op: the same
    recompute as plain checkpoint's). Each region runs alone, forward and backward, on the
    inputs it gets in the step (`ops`: its recorded op stream, which the policy checks), under
    both, side by side: after one warm-up of each, `repeats` pairs, alternating which runs
    first; the median of the pairs' differences, at least 0. The thread count is the caller's.
    None for a region that fails inside checkpoint (autograd's RuntimeError: a module that
    writes its input in place, such as an in-place ReLU, invalidates the input checkpoint keeps).
    """
    calls = _region_inputs(model, regions, step)
    snapshot = _Snapshot(model)
    grads = {p: p.grad for p in model.parameters()}
    out: list[float | None] = []
    try:
        for j, (module, call) in enumerate(zip(regions, calls, strict=True)):
            if call is None:
                raise ValueError(f"region {j} ({type(module).__name__}) is not called by the step")

            try:
                out.append(_paired_overhead(module, call, f"region {j}", ops[j], repeats))
            except RuntimeError:  # e.g. it writes its own input in place: autograd refuses
                out.append(None)
    finally:
        snapshot.restore()
        for p, g in grads.items():
            p.grad = g
    return out


@dataclass(frozen=True)
class _Windows:
    f_start: list[int]
    f_peak: list[int]
    b_start: list[int]
    b_peak: list[int]
    segments: list[Segment]
    peak: int
    splits: list[list[tuple[int, int, int, int]] | None] = field(default_factory=list)
    inner: list[list[Segment] | None] = field(default_factory=list)


def _labels(j: int, children: int | None) -> tuple[list[str], list[str]]:
    """Block j's marks in forward and backward order, its children's (if any) nested."""
    kids = range(children or 0)
    forward = [f"fs{j}", *(f"{k}{j}.{c}" for c in kids for k in ("fs", "fe")), f"fe{j}"]
    return forward, [f"bs{j}", *(f"bs{j}.{c}" for c in reversed(kids))]


def _canonical(counts: Sequence[int | None]) -> list[str]:
    forward: list[str] = []
    backward: list[str] = []
    for j, n in enumerate(counts):
        f, b = _labels(j, n)
        forward += f
        backward = b + backward
    return forward + backward


def measure_windows(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    step: Step,
    children: Sequence[Sequence[nn.Module] | None] | None = None,
) -> _Windows:
    """The plain step's live and peak bytes per window (module docstring, step 1); with
    `children` (per block, its children in call order, or None), the children's windows and
    the block's stretches outside them too, from the same step, for each block whose children
    run once each, in sequence (`splits[j]`: (f_start, f_peak, b_start, b_peak) per child, or
    None; `inner[j]`: the block's stretches outside its children)."""
    from torch._C._profiler import _RecordFunctionFast

    children = list(children) if children is not None else [None] * len(blocks)
    marks: list[str] = []

    def mark(label: str) -> None:
        with _RecordFunctionFast(f"remat.sac:{len(marks)}"):
            marks.append(label)

    def on_leave(label: str, out: object) -> None:
        mark(f"fe{label}")
        fired = []

        def hook(grad: torch.Tensor) -> None:
            if not fired:
                fired.append(True)
                mark(f"bs{label}")

        for t in _tensors(out):
            if t.requires_grad:
                t.register_hook(hook)

    regions = [(str(j), b) for j, b in enumerate(blocks)]
    for j, kids in enumerate(children):
        regions += [(f"{j}.{c}", m) for c, m in enumerate(kids or [])]
    snapshot = _Snapshot(model)
    grads = {p: p.grad for p in model.parameters()}
    model.zero_grad(set_to_none=True)
    handles = []
    for label, module in regions:
        handles.append(module.register_forward_pre_hook(lambda _m, _a, x=label: mark(f"fs{x}")))
        handles.append(module.register_forward_hook(lambda _m, _a, o, x=label: on_leave(x, o)))
    try:
        with _memory_profile() as prof:
            step().backward()
    finally:
        for h in handles:
            h.remove()
        snapshot.restore()
        for p, g in grads.items():
            p.grad = g
    return _cut(prof, marks, [None if not k or len(k) < 2 else len(k) for k in children])


def _cut(prof, marks: list[str], counts: list[int | None]) -> _Windows:
    """Live bytes at each mark and the peak of each stretch between consecutive marks: the
    blocks' windows, and where a block's children ran in sequence, theirs."""
    from graph_capture.peak import _windows

    times = [start for start, _ in _windows(prof, "remat.sac:")]  # in the order of `marks`
    events = _allocation_events(prof)
    timed = sorted(zip(times, marks, strict=True))
    times = [t for t, _ in timed]
    n = len(counts)
    blocks_only = _canonical([None] * n)
    observed = _untie([label for _, label in timed], times, events, _canonical(counts))
    for j, count in enumerate(counts):
        if count is None:
            continue
        own = {x for part in _labels(j, count) for x in part}
        if [x for x in observed if x in own] != [x for x in _canonical(counts) if x in own]:
            counts[j] = None  # its children do not run once each, in sequence
    keep = set(_canonical(counts))
    kept = [(t, x) for t, x in zip(times, observed, strict=True) if x in keep]
    if [x for _, x in kept] != _canonical(counts):
        counts = [None] * n
        kept = [(t, x) for t, x in zip(times, observed, strict=True) if x in blocks_only]
    if [x for _, x in kept if x in blocks_only] != blocks_only:
        raise ValueError(
            "each block must run its forward once per step, in order and not nested, and "
            f"return a tensor that requires grad; the step ran {[x for _, x in timed]}"
        )
    coarse = [(t, x) for t, x in kept if x in blocks_only]
    starts, first, after = _stretches(events, [t for t, _ in coarse])
    at = {label: m for m, (_, label) in enumerate(coarse)}
    segments = [Segment(first, 0)]
    segments += [Segment(after[at[f"fe{j}"]], j + 1) for j in range(n)]
    fine_starts, _, fine_after = _stretches(events, [t for t, _ in kept])
    fat = {label: m for m, (_, label) in enumerate(kept)}
    splits: list[list[tuple[int, int, int, int]] | None] = []
    inner: list[list[Segment] | None] = []
    for j, count in enumerate(counts):
        if count is None:
            splits.append(None)
            inner.append(None)
            continue
        splits.append(
            [
                tuple(
                    v[fat[f"{k}{j}.{c}"]]
                    for k, v in (
                        ("fs", fine_starts),
                        ("fs", fine_after),
                        ("bs", fine_starts),
                        ("bs", fine_after),
                    )
                )
                for c in range(count)
            ]
        )
        inner.append(
            [Segment(fine_after[fat[f"fs{j}"]], 0)]
            + [Segment(fine_after[fat[f"fe{j}.{c}"]], c + 1) for c in range(count)]
            + [Segment(fine_after[fat[f"bs{j}"]], count)]
        )
    return _Windows(
        f_start=[starts[at[f"fs{j}"]] for j in range(n)],
        f_peak=[after[at[f"fs{j}"]] for j in range(n)],
        b_start=[starts[at[f"bs{j}"]] for j in range(n)],
        b_peak=[after[at[f"bs{j}"]] for j in range(n)],
        segments=segments,
        peak=max([first, *after]),
        splits=splits,
        inner=inner,
    )


def _untie(
    labels: list[str], times: list[int], events: list[tuple[int, int]], canonical: list[str]
) -> list[str]:
    """The marks in time order, with adjacent marks put in canonical order where no allocation
    event lies between them (hooks firing together, such as a block's and its last child's on
    one output tensor, run in registration order, not nesting order)."""
    rank = {label: k for k, label in enumerate(canonical)}
    stamps = [t for t, _ in events]
    labels = list(labels)
    changed = True
    while changed:
        changed = False
        for i in range(len(labels) - 1):
            a, b = rank.get(labels[i], -1), rank.get(labels[i + 1], -1)
            if a > b >= 0 and bisect.bisect_left(stamps, times[i]) == bisect.bisect_right(
                stamps, times[i + 1]
            ):
                labels[i], labels[i + 1] = labels[i + 1], labels[i]
                changed = True
    return labels


def _stretches(events: list[tuple[int, int]], times: list[int]) -> tuple[list[int], int, list[int]]:
    """Live bytes at each mark time, the peak before the first, and the peak of the stretch
    from each mark to the next (the last: to the end). An event stamped with a mark's own time
    may fall on either side: it counts on both."""
    live = peak = 0
    starts: list[int] = []
    peaks: list[int] = []  # peak of the stretch before each mark
    k = 0
    for t in times:
        while k < len(events) and events[k][0] < t:
            live += events[k][1]
            peak = max(peak, live)
            k += 1
        before = live
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
    return starts, peaks[0], peaks[1:]


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


def _block(name: str, f: _BlockFacts, window: tuple[int, int, int, int], params: set[int]):
    """The torch-free block of recorded facts and its plain windows (f_start, f_peak, b_start,
    b_peak), its `workspace` the plain forward's measured peak beyond the op-level model."""
    ops = tuple(_op(o) for o in f.ops)
    held_extra = rng_state_bytes() + sum(
        nbytes for s, nbytes in f.inputs.items() if s not in f.packed and s not in params
    )
    block = SacBlock(name, ops, f.stop, held_extra, 0, *window)
    modelled = max((plain_forward_live(block, t) for t in range(len(ops))), default=0)
    workspace = max(0, window[1] - window[0] - modelled)
    return replace(block, workspace=workspace, recompute_extra=rng_state_bytes())


def record_problem(
    model: nn.Module,
    blocks: Sequence[tuple[str, nn.Module]],
    step: Step,
    repeats: int = 3,
) -> SacProblem:
    """The SacProblem of `model`'s step over `blocks` (name, module), in forward order."""
    return record_union(model, blocks, [None] * len(blocks), step, repeats)[0].blocks


def record_union(
    model: nn.Module,
    blocks: Sequence[tuple[str, nn.Module]],
    children: Sequence[Sequence[tuple[str, nn.Module]] | None],
    step: Step,
    repeats: int = 3,
) -> tuple[SacUnion, list[list[tuple[str, nn.Module]] | None]]:
    """The SacUnion of `model`'s step over `blocks` (name, module), in forward order, split
    into `children` (per block, its children in call order, or None) where those run once
    each, in sequence; with the children kept per block (None where the block is not split)."""
    modules = [m for _, m in blocks]
    windows = measure_windows(
        model, modules, step, [None if k is None else [m for _, m in k] for k in children]
    )
    kept = [
        None if split is None else list(kids)
        for split, kids in zip(windows.splits, children, strict=True)
    ]
    flat = [kid for kids in kept if kids is not None for kid in kids]
    facts = record_ops(model, modules, step, repeats)
    flat_facts = record_ops(model, [m for _, m in flat], step, repeats) if flat else []
    overheads = measure_overhead(
        model,
        modules + [m for _, m in flat],
        [[o.name for o in f.ops] for f in facts + flat_facts],
        step,
    )
    for (name, _), seconds in zip(blocks, overheads, strict=False):
        if seconds is None:
            raise ValueError(
                f"block {name} fails inside torch.utils.checkpoint (run alone, forward and "
                "backward): it cannot be a checkpoint region; choose other blocks"
            )
    kid_overheads = iter(overheads[len(blocks) :])
    kid_facts = iter(flat_facts)
    params = {_storage(p) for p in model.parameters()}
    out = []
    for j, ((name, _), f) in enumerate(zip(blocks, facts, strict=True)):
        window = (windows.f_start[j], windows.f_peak[j], windows.b_start[j], windows.b_peak[j])
        out.append(replace(_block(name, f, window, params), overhead=overheads[j]))
    splits: list[SacSplit | None] = []
    for j, kids in enumerate(kept):
        if kids is None:
            splits.append(None)
            continue
        made = [
            replace(_block(n, next(kid_facts), w, params), overhead=next(kid_overheads))
            for (n, _), w in zip(kids, windows.splits[j], strict=True)
        ]
        if any(child.overhead is None for child in made):
            kept[j] = None  # a child that cannot be a checkpoint region: the block has no split
            splits.append(None)
            continue
        splits.append(SacSplit(tuple(made), tuple(windows.inner[j])))
    problem = SacProblem(tuple(out), tuple(windows.segments), windows.peak)
    return SacUnion(problem, tuple(splits)), kept
