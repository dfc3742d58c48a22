"""Regions that record alike (estimate mode): a region's kind is its class, its parameters' and
buffers' names, shapes and dtypes, its inputs' structure, shapes, strides and dtypes, and the
fingerprint of its forward in the step: per dispatched op, its name, its outputs' shapes,
strides, dtypes, storage sizes and whether each output's storage is new, which earlier op of
the region (or which input) made each tensor it reads, and the tensors autograd saves, by the
op that made them. Regions of one kind record the same facts (op streams, bytes, seconds,
liveness, what autograd saves), so a recording records the first of each kind and gives its
facts to the others (`executor.sac.recording.record`); every region's fingerprint is taken in the
same step, so no region takes another's facts unless its own forward matched op by op.

Under fake tensors nothing is noisy and every fact follows from shapes, dtypes and the data
flow, which the fingerprint holds; in measured mode, where seconds and kernel scratch are
measured per run, every region is recorded (no kinds)."""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from executor.sac.recording.measurer import storage_key
from executor.sac.recording.region_timing import copy_tensors
from executor.sac.step import LossClosure, Snapshot, hooked, leaf_tensors


def _tensor_sig(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.requires_grad)


def call_signature(call: object, params: set[int]) -> tuple:
    """The structure of a region's (args, kwargs) with each tensor's shape, stride, offset,
    dtype, `requires_grad` and whether it is a parameter, and each other leaf's value where
    it is a number, string, None or bool (else its type: an object passed alike)."""
    leaves, spec = pytree.tree_flatten(call)
    sig = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            sig.append((*_tensor_sig(x), storage_key(x) in params))
        elif x is None or isinstance(x, (bool, int, float, str)):
            sig.append((type(x).__name__, x))
        else:
            sig.append(("object", type(x).__qualname__))
    return (str(spec), tuple(sig))


def module_signature(module: nn.Module) -> tuple:
    """A module's class and its parameters' and buffers' names, shapes and dtypes."""
    return (
        type(module),
        tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()),
    )


class Fingerprints(TorchDispatchMode):
    """Per region, the fingerprint of its forward (module docstring), regions nested; ops
    dispatched while `paused` (the recording's own copies) are not the model's."""

    def __init__(self, regions: Sequence[nn.Module], params: set[int]) -> None:
        super().__init__()
        self.params = params  # the model's parameters' storages
        self.calls: list[tuple | None] = [None] * len(regions)  # `call_signature` of each
        self.ops: list[list[tuple] | None] = [None] * len(regions)
        self.open: list[tuple[int, dict[int, int]]] = []  # (region, storage -> maker)
        self.paused = False

    @contextlib.contextmanager
    def pausing(self) -> Iterator[None]:
        """A block whose ops are not fingerprinted."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def hooks(self, regions: Sequence[nn.Module]) -> list:
        """Forward pre-hooks and hooks opening and closing each region (its first call)."""
        handles = []
        for j, m in enumerate(regions):
            enter = lambda _m, a, k, j=j: self.enter(j, (a, k))  # noqa: E731
            handles.append(m.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(m.register_forward_hook(lambda _m, _a, o, j=j: self.leave(j, o)))
        return handles

    def enter(self, j: int, call: object) -> None:
        if self.ops[j] is not None:
            self.ops[j].append(("called again",))
            return
        self.ops[j] = []
        self.calls[j] = call_signature(call, self.params)
        makers = {storage_key(t): -1 - k for k, t in enumerate(leaf_tensors(call))}
        self.open.append((j, makers))

    def leave(self, j: int, out: object) -> None:
        if self.open and self.open[-1][0] == j:
            _, makers = self.open.pop()
            made = tuple(makers.get(storage_key(t)) for t in leaf_tensors(out))
            self.ops[j].append(("out", made))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not self.paused:
            for j, makers in self.open:
                self.ops[j].append(("saved", makers.get(storage_key(t)), _tensor_sig(t)))
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused or not self.open:
            return out
        read = leaf_tensors((args, kwargs))
        reads = [storage_key(t) for t in read]
        shapes = tuple(_tensor_sig(t) for t in read)
        outs = leaf_tensors(out)
        for j, makers in self.open:
            ops = self.ops[j]
            made = []
            for t in outs:
                key = storage_key(t)
                new = key not in reads and key not in makers
                made.append((*_tensor_sig(t), t.untyped_storage().nbytes(), new))
            ops.append((str(func), tuple(makers.get(k) for k in reads), shapes, tuple(made)))
            for t in outs:
                makers.setdefault(storage_key(t), len(ops) - 1)
        return out


def region_inputs(
    model: nn.Module,
    regions: Sequence[nn.Module],
    step: LossClosure,
    prints: Fingerprints | None = None,
) -> list:
    """Per region, the (args, kwargs) it is called with in one forward of the step: tensors
    detached and cloned, each with its `requires_grad`, identity and aliasing kept
    (`copy_tensors`); with `prints`, each region's fingerprint taken in the same forward
    (executor/sac/recording/alike.py)."""
    calls: list = [None] * len(regions)

    def keep(j: int, args, kwargs) -> None:
        if calls[j] is None:
            with prints.pausing() if prints is not None else contextlib.nullcontext():
                calls[j] = copy_tensors(
                    (args, kwargs), lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                )

    handles = [
        m.register_forward_pre_hook(lambda _m, a, k, j=j: keep(j, a, k), with_kwargs=True)
        for j, m in enumerate(regions)
    ]
    watching = contextlib.ExitStack()
    if prints is not None:
        handles += prints.hooks(regions)
        watching.enter_context(prints)
        watching.enter_context(torch.autograd.graph.saved_tensors_hooks(prints.pack, lambda t: t))
    snapshot = Snapshot(model)
    try:
        with hooked(handles), watching:
            loss = step()
        del loss
    finally:
        snapshot.restore()
    return calls


def region_kinds(
    model: nn.Module, regions: Sequence[nn.Module], step: LossClosure
) -> tuple[list, list[Hashable]]:
    """Per region, its inputs in one forward of the step (`region_inputs`) and its
    kind (module docstring), from that forward: equal kinds record equal facts."""
    prints = Fingerprints(regions, {storage_key(p) for p in model.parameters()})
    calls = region_inputs(model, regions, step, prints)
    kinds = [
        (module_signature(m), prints.calls[j], tuple(prints.ops[j] or ()))
        for j, m in enumerate(regions)
    ]
    return calls, kinds
