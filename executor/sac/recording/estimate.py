"""Estimate mode: a SAC recording with no real step (`checkpoint_plan(..., target=...)`).

The model (on the CPU or the meta device) runs under torch's `FakeTensorMode` with its
parameters, buffers and inputs swapped for fake tensors on the CPU device for the length of the
recording (`Estimate.running`): fake tensors carry shapes, dtypes, strides and storages but no
data, so an 8B-parameter step runs here in seconds. Fake rather than plain meta tensors: a meta
tensor's dispatch is the meta device's, while a fake CPU tensor dispatches what the CPU does
(scaled_dot_product_attention picks the CPU's fused kernel), so the recorded op streams are the
real run's; and a CPU model's own weights stay untouched (only swapped out for the run).

`_Tracker`, a dispatch mode under every run, supplies what the profiler supplies for a real step:
- bytes: each storage an op creates (one not among its inputs' storages and not already live),
  rounded as the target's allocator rounds (`Device.round_bytes`), is an allocation event; a
  `weakref.finalize` on the storage (torch keeps a storage's Python object alive as long as
  the storage lives) makes its free an event, when the last tensor on it dies, as in the real
  run: a logical clock orders the events and the marks of `Estimate.timeline`; an op's kernel
  workspace (`graph_capture.measurement.workspace.workspace_bytes`, the traced-graph estimate's
  model too) is an allocation right after its outputs' and a free right after it;
- values: integer and boolean tensors whose inputs are known (the real inputs of a CPU model,
  `arange` positions) are also computed for real (at most `_SHADOW_NUMEL` elements), so that a
  model branching on them (`bool(t)`, `.item()`) takes the branch the real run takes, and
  transformers' `is_tracing` sees such a tensor as not traced (HF's causal-mask skip reads
  `position_ids` and the padding mask: under bare fake tensors it builds an explicit mask and
  GPT-2's block dispatches 66 ops instead of the real 68);
- refusals (`PlanError`): a tensor that is not fake (real memory held or made outside the
  swapped parameters and buffers), an op whose output shape depends on values (`nonzero`,
  `masked_select`), a value read that is not known.

Seconds are the target's model of each op (`graph_capture.measurement.roofline.op_seconds`);
a region's checkpoint price is its ops' seconds up to `stop` (nothing beyond them), and its SAC
overhead this host's measured per-op cost of SAC's dispatch modes (`sac_dispatch_seconds`)
times its ops in the forward and the recompute. Each region still runs alone once per kind
(fake) inside checkpoint, so a region checkpoint refuses is refused as when measured. Each op's
scratch bytes are its workspace (`Estimate.scratch`).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
import weakref
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils.weak import WeakIdKeyDictionary

from executor.errors import PlanError
from executor.sac.recording.measurer import Measurer, Timeline, storage_key
from executor.sac.recording.region_timing import RegionTimes, region_step
from executor.sac.step import leaf_tensors
from graph_capture.errors import data_dependence
from graph_capture.measurement.roofline import op_seconds
from graph_capture.measurement.workspace import workspace_bytes
from solver.sac.windows import Allocation
from solver.target import Device

__all__ = ["Estimate", "sac_dispatch_seconds"]

_SHADOW_NUMEL = 1 << 20
"""Integer and boolean tensors up to this many elements are computed for real when their
inputs are known (positions, masks, labels)."""

aten = torch.ops.aten
_UNMARKED_WRITES = {aten.native_batch_norm.default: (3, 4)}
"""Ops whose CPU kernels write arguments their schema does not mark as written (BatchNorm's
running statistics in training), by argument position."""

_VALUE_READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
"""Ops that return a tensor's value to Python; answered from known values."""

_MEASURED_MODE = "plan it in measured mode (target=None) on a model that runs here"


class _Tracker(TorchDispatchMode):
    """Storages created and freed (events on a logical clock), known integer values, and the
    storages written without a schema mark; see the module docstring."""

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self.clock = 0
        self.events: list[tuple[int, int]] = []
        self.live: dict[int, int] = {}  # storage -> bytes
        self.made: dict[int, tuple] = {}  # storage -> when, op, shape, dtype (no reference)
        self.allocations: list[Allocation] = []  # those freed, while `labelling`
        self.labelling = False
        self.values = WeakIdKeyDictionary()  # fake tensor -> its real value
        self.stale: set[int] = set()  # storages written by an op not computed for real
        self.unmarked: set[int] = set()  # storages written by `_UNMARKED_WRITES`
        self.sequence: list[tuple[Hashable, int]] | None = None  # keyed, while `sequencing`
        self.sequenced: set[int] = set()  # storages allocated while sequencing, live

    def known(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and t in self.values and storage_key(t) not in self.stale

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = leaf_tensors((args, kwargs))
        for t in tensors:
            if not isinstance(t, FakeTensor):
                raise PlanError(
                    f"estimate mode runs the model on fake tensors, and {func} got a real "
                    f"{t.device} tensor of shape {tuple(t.shape)}: the model holds or makes "
                    "tensors outside its parameters and buffers (a plain attribute, a global, "
                    "numpy), which allocate real memory; register it as a buffer, or "
                    f"{_MEASURED_MODE}"
                )
        computable = torch.Tag.nondeterministic_seeded not in func.tags and all(
            not t.is_floating_point() and not t.is_complex() and self.known(t) for t in tensors
        )
        if computable and func in _VALUE_READS:
            return self._real(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            if reason := data_dependence(e):
                raise PlanError(
                    f"{func} has a data-dependent {reason}, which estimate mode does not know: "
                    f"{_MEASURED_MODE}"
                ) from e
            raise
        outs = leaf_tensors(out)
        self._written(func, args, kwargs)
        self._allocated(func, tensors, outs)
        if workspace := workspace_bytes(self.device, func, args, kwargs, out):
            self.events += [(self.clock + 1, workspace), (self.clock + 2, -workspace)]
            self.clock += 2
            if self.sequence is not None:
                key = ("workspace", self.clock)
                self.sequence += [(key, workspace), (key, 0)]
        if (
            computable
            and outs
            and all(not o.is_floating_point() and o.numel() <= _SHADOW_NUMEL for o in outs)
        ):
            real = leaf_tensors(self._real(func, args, kwargs))
            for o, r in zip(outs, real, strict=True):
                self.values[o] = r
                self.stale.discard(storage_key(o))
        return out

    def _real(self, func, args: tuple, kwargs: dict) -> Any:
        """`func` on the known values of its fake arguments, with every mode off."""

        def value(x):
            if isinstance(x, torch.Tensor):
                return self.values[x]
            return torch.device("cpu") if isinstance(x, torch.device) else x

        with _disable_current_modes():
            return func(*pytree.tree_map(value, args), **pytree.tree_map(value, kwargs))

    def _written(self, func, args: tuple, kwargs: dict) -> None:
        """Storages the op writes: stale until computed for real; `unmarked` ones noted."""
        for k, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[k] if k < len(args) else kwargs.get(arg.name)
                self.stale.update(storage_key(t) for t in leaf_tensors(value))
        if func in _UNMARKED_WRITES and args[5]:  # training
            for k in _UNMARKED_WRITES[func]:
                if isinstance(args[k], torch.Tensor):
                    self.unmarked.add(storage_key(args[k]))

    def _allocated(self, func, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        read = {storage_key(t) for t in inputs}
        for t in outs:
            if not isinstance(t, FakeTensor):
                raise PlanError(
                    f"estimate mode runs the model on fake tensors, and an op returned a real "
                    f"{t.device} tensor of shape {tuple(t.shape)}: the model allocates real "
                    f"memory; {_MEASURED_MODE}"
                )
            storage = t.untyped_storage()
            key = storage._cdata
            if key in read or key in self.live:
                continue
            nbytes = self.device.round_bytes(storage.nbytes())
            self.live[key] = nbytes
            self.clock += 1
            self.events.append((self.clock, nbytes))
            if self.labelling:
                self.made[key] = (self.clock, func, tuple(t.shape), t.dtype)
            if self.sequence is not None:
                self.sequence.append((key, nbytes))
                self.sequenced.add(key)
            weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        nbytes = self.live.pop(key, 0)
        self.stale.discard(key)
        self.unmarked.discard(key)
        self.clock += 1
        self.events.append((self.clock, -nbytes))
        if key in self.made:
            self.allocations.append(self._allocation(key, nbytes, self.clock))
        if key in self.sequenced:
            self.sequenced.discard(key)
            if self.sequence is not None:
                self.sequence.append((key, 0))

    def _allocation(self, key: int, nbytes: int, end: int | None) -> Allocation:
        """The `Allocation` of a storage made while labelling, freed at `end` (None: live)."""
        start, func, shape, dtype = self.made.pop(key)
        what = f"{func}'s {list(shape)} {str(dtype).removeprefix('torch.')} output"
        return Allocation(start, end, nbytes, what)

    def labelled(self) -> list[Allocation]:
        """The allocations made while labelling, those still live included; labelling ends."""
        live = [self._allocation(k, self.live.get(k, 0), None) for k in list(self.made)]
        out, self.allocations, self.labelling = self.allocations + live, [], False
        return sorted(out)


class _Tracked(Timeline):
    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def mark(self) -> None:
        self.tracker.clock += 1
        self.times.append(self.tracker.clock)


def _fake(mode: FakeTensorMode, t: torch.Tensor) -> FakeTensor:
    """`t` as a fake tensor on the CPU device (a meta tensor's device taken as the CPU)."""
    if t.device.type == "meta":
        return mode.fake_tensor_converter.from_meta_and_device(mode, t, torch.device("cpu"))
    return mode.from_tensor(t)


@contextlib.contextmanager
def _swapped(model: nn.Module, fake) -> Iterator[None]:
    """Every module's parameters and buffers replaced by `fake` of them for the block (tied
    ones stay tied), put back after it."""
    swapped = []
    for module in model.modules():
        for slots in (module._parameters, module._buffers):
            for name, t in slots.items():
                if t is not None:
                    swapped.append((slots, name, t))
                    slots[name] = fake(t)
    try:
        yield
    finally:
        for slots, name, t in swapped:
            slots[name] = t


@contextlib.contextmanager
def _values_visible_to_transformers(tracker: _Tracker) -> Iterator[None]:
    """transformers' `is_tracing` (which reads `is_fake_tensor`) answering False for a fake
    tensor whose value is known, so HF reads the value as in a real run."""
    utils = sys.modules.get("transformers.utils.import_utils")
    if utils is None or not hasattr(utils, "is_fake_tensor"):
        yield
        return
    original = utils.is_fake_tensor
    utils.is_fake_tensor = lambda x: original(x) and not tracker.known(x)
    try:
        yield
    finally:
        utils.is_fake_tensor = original


@functools.cache
def sac_dispatch_seconds(ops: int = 64, repeats: int = 15) -> float:
    """This host's seconds per op that a region under a SAC policy pays beyond plain
    checkpoint (SAC's Python dispatch modes in the forward and in the recompute), measured
    once per process on a chain of `ops` small pointwise ops: the median of `repeats`
    differences of forward and backward under both, over `ops`."""

    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(ops):
            x = x * 1.0001
        return x

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_RECOMPUTE

    def run(sac: bool) -> float:
        x = torch.ones(4, requires_grad=True)
        extra = {"context_fn": functools.partial(create_selective_checkpoint_contexts, policy)}
        start = time.perf_counter()
        checkpoint(chain, x, use_reentrant=False, **(extra if sac else {})).sum().backward()
        return time.perf_counter() - start

    with _disable_current_modes():
        run(False), run(True)
        differences = [run(True) - run(False) for _ in range(repeats)]
    return max(0.0, statistics.median(differences)) / ops


class Estimate(Measurer):
    """The recording's measurer in estimate mode (module docstring): `target` the device's
    name."""

    measures_scratch = False
    runs_warmup = False
    records_alike = True

    def __init__(self, device: Device) -> None:
        super().__init__()  # the CPU's meter: the fake step and SAC's offload overhead run here
        self.device = device
        self.target = device.name
        self.tracker = _Tracker(device)
        self.per_op = sac_dispatch_seconds()
        self.refused: dict[object, RuntimeError | None] = {}

    @contextlib.contextmanager
    def running(self, model: nn.Module, inputs: Any) -> Iterator[Any]:
        mode = FakeTensorMode(allow_non_fake_inputs=False)
        fakes: dict[int, FakeTensor] = {}

        def fake(t: torch.Tensor) -> FakeTensor:
            if id(t) not in fakes:
                fakes[id(t)] = _fake(mode, t)
            return fakes[id(t)]

        fake_inputs = pytree.tree_map_only(torch.Tensor, fake, inputs)
        for t in leaf_tensors(inputs):
            if t.device.type == "cpu" and not t.is_floating_point() and t.numel() <= _SHADOW_NUMEL:
                self.tracker.values[fakes[id(t)]] = t
        with (
            _swapped(model, fake),
            mode,
            self.tracker,
            _values_visible_to_transformers(self.tracker),
        ):
            yield fake_inputs

    def nbytes(self, t: torch.Tensor) -> int:
        return self.device.round_bytes(t.untyped_storage().nbytes())

    def call(self, func, args: tuple, kwargs: dict) -> tuple[Any, float]:
        out = func(*args, **kwargs)
        return out, op_seconds(self.device, func, args, kwargs, out)

    def scratch(self, func, args: tuple, kwargs: dict, out: Any) -> int:
        """The op's kernel workspace on the target (`workspace_bytes`)."""
        return workspace_bytes(self.device, func, args, kwargs, out)

    @contextlib.contextmanager
    def timeline(self) -> Iterator[Timeline]:
        line = _Tracked(self.tracker)
        self.tracker.events = []
        self.tracker.labelling = True
        try:
            yield line
        finally:
            line.allocations = self.tracker.labelled()
        line.events, self.tracker.events = self.tracker.events, []

    @contextlib.contextmanager
    def sequencing(self) -> Iterator[list[tuple[Hashable, int]]]:
        """The allocations and frees made inside the block, in order, as the caching allocator's
        model takes them (`solver.target.caching_allocator.simulate`): (storage, bytes rounded
        as the target rounds) for a storage made, (storage, 0) for its free, an op's workspace
        as its own key made and freed right after the op. Storages made before the block and
        freed in it are left out; those made in it and live at its end have no free."""
        sequence: list[tuple[Hashable, int]] = []
        self.tracker.sequence, self.tracker.sequenced = sequence, set()
        try:
            yield sequence
        finally:
            self.tracker.sequence = None

    def changed(self, buffer: torch.Tensor, before: torch.Tensor) -> bool:
        return storage_key(buffer) in self.tracker.unmarked

    def rng_state_bytes(self) -> int:
        """The CPU generator's state on target cpu; on a GPU, RNG states are host tensors."""
        return super().rng_state_bytes() if self.device.name == "cpu" else 0

    def region_times(self, module: nn.Module, call, name: str, stream, rounds: Iterable[int]):
        """Predicted `RegionTimes`: overhead `per_op` times the ops of the forward and the
        recompute, checkpoint the seconds of the ops up to `stop` (its price 0). The region
        runs alone once per kind (class and op stream), fake, inside plain checkpoint: its
        error where checkpoint refuses it."""
        kind = (type(module), stream.ops)
        if kind not in self.refused:
            try:
                region_step(module, call, None)
                self.refused[kind] = None
            except RuntimeError as e:
                self.refused[kind] = e
        if self.refused[kind] is not None:
            raise self.refused[kind]
        overhead = self.per_op * (len(stream.ops) + stream.stop + 1)
        return RegionTimes(overhead, sum(stream.seconds[: stream.stop + 1]))

    def repeats(self, most: int) -> int:
        return 1  # nothing is noisy
