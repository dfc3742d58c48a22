"""Record each block's forward op stream (`record_ops`): the forward, once per run, under a
TorchDispatchMode that sees the ops the SAC policy sees (every dispatched op but
`SAC_IGNORED_OPS`) and under saved-tensor hooks that see what autograd saves: per op its new
storage bytes (deduplicated by storage; and unrounded, for a park's host copies), the bytes
of a host copy of each of its output tensors (for an offload's), the last op reading it,
whether autograd saves it, whether it may be MUST_SAVE, and its wall time in each run
(pointwise ops count 0 FLOPs yet take real time on CPU); per block its inputs' bytes, `stop`
(its last op before its last pack) and the buffers its forward mutates. A run whose op stream
differs from the first's is a PlanError. Then once more under the profiler, each op in a
window, for its scratch bytes (`_measure_scratch`). The facts are
`executor.sac.recording.facts.BlockFacts`; bytes and seconds come from a measurer
(`executor.sac.recording.measurer`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS

from executor.errors import PlanError
from executor.sac.recording.facts import BlockFacts, OpFacts
from executor.sac.recording.measurer import Measurer, storage_key
from executor.sac.runtime.region import buffer_state, mutated_buffers
from executor.sac.step import LossClosure, Snapshot, hooked, leaf_tensors
from graph_capture.measurement.peak import memory_profile


class _Recorder(TorchDispatchMode):
    """Attributes each dispatched op to the block running (`block`, None outside blocks)."""

    def __init__(
        self, blocks: list[BlockFacts], first: bool, measurer: Measurer, mark_ops: bool = False
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
        requested: dict[int, int] = {}  # the same storages' bytes, unrounded
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
                requested[s] = t.untyped_storage().nbytes()
        random = torch.Tag.nondeterministic_seeded in func.tags
        scratch = self.measurer.scratch(func, args, kwargs, out)
        # an offload copies each output tensor to a host buffer of its own (HostCopies.pack)
        copies = tuple(t.numel() * t.element_size() for t in leaf_tensors(out))
        facts.ops.append(
            OpFacts(
                str(func),
                i,
                random,
                [seconds],
                storages,
                scratch=scratch,
                host_sizes=copies,
                requested=requested,
            )
        )
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


def _buffer_hooks(blocks: Sequence[nn.Module], facts: list[BlockFacts], measurer: Measurer) -> list:
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


def record_ops(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    step: LossClosure,
    runs: Iterable[int] = range(3),
    measurer: Measurer | None = None,
    whole: bool = True,
) -> list[BlockFacts]:
    """Each block's forward op stream over the forwards `runs` (0, 1, ...; the module
    docstring), its bytes and seconds from `measurer` (default `Measurer`); `whole=False`: each
    forward ends where the last of `blocks` (in call order) returns."""
    measurer = measurer or Measurer()
    facts = [BlockFacts() for _ in blocks]
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


def _measure_scratch(model, blocks, step: LossClosure, facts: list[BlockFacts], measurer) -> None:
    """Each op's scratch bytes: the most it held at once during its call beyond what it left
    allocated at its end (its outputs), from the profiler's allocation events in a window
    around the call."""
    from graph_capture.measurement.peak import window_peaks

    recorder = _Recorder(facts, False, measurer, mark_ops=True)
    handles = _hooks(blocks, recorder.enter, lambda _j, _o: setattr(recorder, "block", None))
    with hooked(handles), memory_profile() as prof, recorder:
        loss = step()
        del loss
    peaks = window_peaks(prof, "remat.sacop:", measurer.meter.device)
    for (j, i), (peak, end) in zip(recorder.marked, peaks, strict=True):
        facts[j].ops[i].scratch = max(facts[j].ops[i].scratch, peak - end)
