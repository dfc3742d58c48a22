"""Where a recording's bytes and seconds come from: `Measurer` (a real step here, on the device
the model and inputs are on, `DeviceMeter`: the profiler's allocation events of that device,
wall-clock seconds with the device synchronized, regions timed alone) or
`executor.sac.recording.estimate.Estimate` (a step under fake tensors: storages created and freed,
seconds from a target device's model). The recording (executor/sac/recording/record.py, windows.py,
op_streams.py, overhead.py) is one code path; it asks its measurer for each number."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from executor.sac.recording import region_timing
from graph_capture.measurement.peak import CPU, allocation_events, marked_windows, memory_profile
from solver.sac.windows import Allocation

CUDA_BLOCK = 512
"""Bytes the CUDA caching allocator rounds every request up to a multiple of
(``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp's ``round_size``; at least one block;
``roundup_power2_divisions`` in ``PYTORCH_ALLOC_CONF`` rounds further: the reserved-memory model,
`solver.target.caching_allocator`, applies it, the recording's bytes do not)."""


def storage_key(t: torch.Tensor) -> int:
    """The identity of `t`'s storage while it lives (its `StorageImpl`; fake and meta tensors
    included, whose data pointers are all 0)."""
    return t.untyped_storage()._cdata


class Timeline:
    """A step's live bytes over time: `events` (time, +bytes allocated / -bytes freed) in time
    order and `times`, the time of each `mark` in the order made; `allocations`, where the
    measurer knows what each allocation is (estimate mode; empty from the profiler):
    `solver.sac.windows.Allocation`s. Filled when its context (`Measurer.timeline`) ends."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []
        self.times: list[int] = []
        self.allocations: list[Allocation] = []
        self.count = 0

    def mark(self) -> None:
        """A mark at the present moment of the step."""
        raise NotImplementedError


class _Profiled(Timeline):
    def mark(self) -> None:
        from torch._C._profiler import _RecordFunctionFast

        with _RecordFunctionFast(f"remat.sac:{self.count}"):
            self.count += 1


class DeviceMeter:
    """The device a measured recording runs on (the CPU or one CUDA device), and how it is
    read: `now` the host's clock (`clock`, seconds) after the device's queued work has
    ended (`cuda.synchronize`: a CUDA op's seconds are its launch and its kernels, and a
    region's also the host's Python around them, which is what checkpoint's price and SAC's
    overhead are; CUDA events would time the stream alone), `events` the profiler's
    allocation events of the device, `nbytes` what its allocator holds for a storage, and
    `rng_states` the generator states a checkpoint keeps (the CPU's and, on CUDA, the
    device's). `cuda`: the `torch.cuda` calls it makes (`synchronize`, `get_rng_state`); a
    test passes a recording fake."""

    def __init__(
        self,
        device: torch.device = CPU,
        cuda: Any = torch.cuda,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.device = torch.device(device)
        self.cuda = cuda
        self.clock = clock

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def now(self) -> float:
        """Seconds on the host's clock once the device has finished what was queued."""
        if self.is_cuda:
            self.cuda.synchronize(self.device)
        return self.clock()

    def events(self, prof: torch.profiler.profile) -> list[tuple[int, int]]:
        """(time ns, bytes) of the device's allocations and frees the profiler saw."""
        return allocation_events(prof, self.device)

    def nbytes(self, storage_bytes: int) -> int:
        """Bytes the device's allocator holds for a storage of `storage_bytes`: as many on the
        CPU; on CUDA rounded up to `CUDA_BLOCK` (0 for an empty storage, which takes no
        block)."""
        if not self.is_cuda or storage_bytes == 0:
            return storage_bytes
        return -(-storage_bytes // CUDA_BLOCK) * CUDA_BLOCK

    def rng_states(self) -> list[torch.Tensor]:
        """The generator states a checkpoint keeps from its forward to its backward
        (`preserve_rng_state=True`): the CPU generator's and, on CUDA, the device's
        (`torch.cuda.get_rng_state`, a host tensor)."""
        states = [torch.get_rng_state()]
        if self.is_cuda:
            states.append(self.cuda.get_rng_state(self.device))
        return states


class Measurer:
    """Measures a real step here, on `meter`'s device (default the CPU): bytes from that device's
    allocation events and storages' sizes, seconds by the host's clock with the device
    synchronized, each region's checkpoint price and SAC overhead timed alone
    (`executor.sac.recording.overhead`). `target` is None: the plan is measured, not predicted."""

    target: str | None = None
    measures_scratch = True  # each op's kernel scratch, from a profiled forward
    runs_warmup = True  # one plain step first, so the model's own errors surface as they are
    records_alike = False  # regions of one kind recorded once (executor/sac/recording/alike.py)

    def __init__(self, meter: DeviceMeter | None = None) -> None:
        self.meter = meter or DeviceMeter()

    @contextlib.contextmanager
    def running(self, model: nn.Module, inputs: Any) -> Iterator[Any]:
        """The context of a whole recording of `model` on `inputs`: yields the inputs the step
        takes."""
        yield inputs

    def nbytes(self, t: torch.Tensor) -> int:
        """Bytes held for `t`'s storage (`DeviceMeter.nbytes`)."""
        return self.meter.nbytes(t.untyped_storage().nbytes())

    def call(self, func, args: tuple, kwargs: dict) -> tuple[Any, float]:
        """Run one dispatched op: its output and its seconds (`DeviceMeter.now`)."""
        start = self.meter.now()
        out = func(*args, **kwargs)
        return out, self.meter.now() - start

    def scratch(self, func, args: tuple, kwargs: dict, out: Any) -> int:
        """Scratch bytes of an op just run by `call`: 0 here, where a profiled forward measures
        each op's (`measures_scratch`)."""
        return 0

    @contextlib.contextmanager
    def timeline(self) -> Iterator[Timeline]:
        """A `Timeline` of the step run inside the context."""
        line = _Profiled()
        with memory_profile() as prof:
            yield line
        line.times = [start for start, _ in marked_windows(prof, "remat.sac:")]
        line.events = self.meter.events(prof)

    def changed(self, buffer: torch.Tensor, before: torch.Tensor) -> bool:
        """Whether `buffer` holds other values than its copy `before` (a kernel writing a
        buffer its schema does not mark as written leaves its version counter as it was)."""
        return not torch.equal(buffer, before)

    def rng_state_bytes(self) -> int:
        """Bytes of the RNG states a checkpoint keeps on the device from its forward to its
        backward (`preserve_rng_state=True`, the default): those of `DeviceMeter.rng_states`
        that lie on the device (on the CPU the CPU generator's; on CUDA none: both states
        are host tensors, outside the device's budget)."""
        states = self.meter.rng_states()
        return sum(s.untyped_storage().nbytes() for s in states if s.device == self.meter.device)

    def region_times(self, module: nn.Module, call, name: str, stream, rounds: Iterable[int]):
        """The region's `RegionTimes` (executor/sac/recording/region_timing.py), measured: `rounds`
        (0, 1, ...) of it alone on `call` (its args and kwargs in the step), three ways side by
        side, on the meter's clock; `stream` its recorded op stream (`overhead.Stream`)."""
        return region_timing.region_times(module, call, name, stream.ops, rounds, self.meter.now)

    def repeats(self, most: int) -> int:
        """How many runs a measurement takes at most (noisy ones repeat)."""
        return most
