"""Where a recording's bytes and seconds come from: `Measured` (a real step here: the
profiler's allocation events, wall-clock seconds, regions timed alone) or
`executor.sac.estimate.Estimate` (a step under fake tensors: storages created and freed,
seconds from a target device's model). The recording (executor/sac/record.py, windows.py,
op_streams.py, overhead.py) is one code path; it asks its measurer for each number."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from executor.sac import region_timing
from graph_capture.measurement.peak import allocation_events, marked_windows, memory_profile


def storage_key(t: torch.Tensor) -> int:
    """The identity of `t`'s storage while it lives (its `StorageImpl`; fake and meta tensors
    included, whose data pointers are all 0)."""
    return t.untyped_storage()._cdata


class Timeline:
    """A step's live bytes over time: `events` (time, +bytes allocated / -bytes freed) in time
    order and `times`, the time of each `mark` in the order made. Filled when its context
    (`Measurer.timeline`) ends."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []
        self.times: list[int] = []
        self.count = 0

    def mark(self) -> None:
        """A mark at the present moment of the step."""
        raise NotImplementedError


class _Profiled(Timeline):
    def mark(self) -> None:
        from torch._C._profiler import _RecordFunctionFast

        with _RecordFunctionFast(f"remat.sac:{self.count}"):
            self.count += 1


class Measured:
    """A real step here: bytes from the CPU allocator's profiler events and storages' sizes,
    seconds by wall clock, each region's checkpoint price and SAC overhead timed alone
    (`executor.sac.overhead`). `target` is None: the plan is measured, not predicted."""

    target: str | None = None
    measures_scratch = True  # each op's kernel scratch, from a profiled forward
    runs_warmup = True  # one plain step first, so the model's own errors surface as they are
    records_alike = False  # regions of one kind recorded once (executor/sac/alike.py)

    @contextlib.contextmanager
    def running(self, model: nn.Module, inputs: Any) -> Iterator[Any]:
        """The context of a whole recording of `model` on `inputs`: yields the inputs the step
        takes."""
        yield inputs

    def nbytes(self, t: torch.Tensor) -> int:
        """Bytes held for `t`'s storage."""
        return t.untyped_storage().nbytes()

    def call(self, func, args: tuple, kwargs: dict) -> tuple[Any, float]:
        """Run one dispatched op: its output and its seconds."""
        start = time.perf_counter()
        out = func(*args, **kwargs)
        return out, time.perf_counter() - start

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
        line.events = allocation_events(prof)

    def changed(self, buffer: torch.Tensor, before: torch.Tensor) -> bool:
        """Whether `buffer` holds other values than its copy `before` (a kernel writing a
        buffer its schema does not mark as written leaves its version counter as it was)."""
        return not torch.equal(buffer, before)

    def rng_state_bytes(self) -> int:
        """Bytes of the RNG state a checkpoint keeps on the device from its forward to its
        backward (`preserve_rng_state=True`, the default): the CPU generator's."""
        return torch.get_rng_state().untyped_storage().nbytes()

    def region_times(self, module: nn.Module, call, name: str, stream, rounds: Iterable[int]):
        """The region's `RegionTimes` (executor/sac/region_timing.py), measured: `rounds` (0,
        1, ...) of it alone on `call` (its args and kwargs in the step), three ways side by
        side; `stream` its recorded op stream (`overhead.Stream`)."""
        return region_timing.region_times(module, call, name, stream.ops, rounds)

    def repeats(self, most: int) -> int:
        """How many runs a measurement takes at most (noisy ones repeat)."""
        return most
