"""Measured peak memory of a call, on the device it runs on.

Peak memory is *measured*, not predicted:

- CPU: the PyTorch profiler records every allocation and free of the c10 CPU allocator
  (``profile_memory=True``); the running sum of ``alloc_size`` over those events, in time order,
  is the number of bytes allocated since the window opened (frees of tensors that existed before
  the window make it go down). Its maximum is the peak *above the bytes live at the start*. It
  sees kernel scratch buffers too, since they come from the same allocator (FIELD-NOTES: matched
  a fresh process's VmHWM within 0.1 MiB).
- CUDA: ``torch.cuda.max_memory_allocated`` minus the bytes allocated at the start.

Both report bytes above the start, so parameters, inputs and existing ``.grad`` tensors are not
counted, while activations, temporaries and newly created gradients are.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graph_capture.measurement.device import generator

CPU = torch.device("cpu")
_ALLOCATION = torch._C._profiler._EventType.Allocation

__all__ = [
    "PeakMemory",
    "PeakWindow",
    "Snapshot",
    "allocation_events",
    "event_tree",
    "is_allocation",
    "marked_windows",
    "measure_each",
    "measure_peak",
    "memory_profile",
    "plain_step_peak",
]


@dataclass(frozen=True)
class PeakMemory:
    """A measured peak.

    ``peak_bytes``: the most bytes live at once above ``start`` during the call.
    ``end_bytes``: bytes live above the start after the call returned (what it left allocated).
    ``method``: ``"profiler-allocation-events"`` (CPU) or ``"cuda-max-memory-allocated"``.
    """

    peak_bytes: int
    end_bytes: int
    method: str


def allocation_events(
    prof: torch.profiler.profile, device: torch.device = CPU
) -> list[tuple[int, int]]:
    """(time ns, bytes) of every allocation (+) and free (-) on `device` the profiler saw, in
    time order. The profiler with ``profile_memory`` records each allocator's reports with
    their device (type and index): the CPU allocator's (requested bytes) and, on CUDA, the
    caching allocator's (its blocks' bytes, at the host's time of the call: a block is taken
    and given back on the host, in stream order), from every thread the profiled code runs
    on (autograd's device threads included)."""
    events = [
        (node.start_time_ns, node.extra_fields.alloc_size)
        for node, _ in event_tree(prof)
        if is_allocation(node, device)
    ]
    events.sort(key=lambda e: e[0])
    return events


def event_tree(
    prof: torch.profiler.profile,
    scope: str | None = None,
    leaf: Callable[[Any], bool] | None = None,
) -> Iterator[tuple[Any, bool]]:
    """Every event of the profiler's tree (a profiler event node: `name`, `tag`,
    `start_time_ns`, `end_time_ns`, `extra_fields`, `children`), depth first, each with whether
    it or an event enclosing it is named `scope` (False where `scope` is None). The events
    inside one for which `leaf` is true are left out (a tree read for its marked windows alone
    walks a thousandth of it)."""
    stack = [(node, False) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, inside = stack.pop()
        if scope is not None and not inside:
            inside = node.name == scope
        yield node, inside
        if leaf is None or not leaf(node):
            stack.extend([(child, inside) for child in node.children])


def is_allocation(node: object, device: torch.device = CPU) -> bool:
    """Whether the profiler event `node` is an allocation or free (`extra_fields.alloc_size`
    bytes, + or -, at `extra_fields.ptr`) on `device` (any index where `device` names none)."""
    if node.tag != _ALLOCATION:
        return False
    where = node.extra_fields.device
    return where.type == device.type and (device.index is None or where.index == device.index)


def marked_windows(prof: torch.profiler.profile, prefix: str) -> list[tuple[int, int]]:
    """(start ns, end ns) of the profiler's events named ``prefix<i>`` (at any depth), by i."""
    found: dict[int, tuple[int, int]] = {}

    def marked(node: Any) -> bool:
        return node.name.startswith(prefix)

    for node, _ in event_tree(prof, leaf=marked):
        if marked(node):
            found[int(node.name[len(prefix) :])] = (node.start_time_ns, node.end_time_ns)
    return [found[i] for i in range(len(found))]


class PeakWindow:
    """A measured peak over a window opened here and closed by `close`, possibly in another
    call (a training step's forward, then the end of its backward). Same measurement as
    `measure_peak`."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._stack = contextlib.ExitStack()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._prof = self._stack.enter_context(memory_profile())

    def close(self) -> PeakMemory:
        """End the window: its peak bytes above the start, and the bytes left above it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - self._start
            end = torch.cuda.memory_allocated(self.device) - self._start
            return PeakMemory(peak, end, "cuda-max-memory-allocated")
        self._stack.close()
        live = peak = 0
        for _, size in allocation_events(self._prof):
            live += size
            peak = max(peak, live)
        return PeakMemory(peak, live, "profiler-allocation-events")


def measure_peak(fn: Callable[[], object], device: str | torch.device = "cpu") -> PeakMemory:
    """Run ``fn()`` once and return its measured peak memory in bytes above the start.

    The result of ``fn`` is dropped before the end is read, so ``end_bytes`` counts only what
    ``fn`` left behind elsewhere (e.g. new ``.grad`` tensors).
    """
    window = PeakWindow(device)
    result = fn()
    del result
    return window.close()


class Snapshot:
    """Generator states (the CPU's, and each CUDA device's the model is on), buffers and
    parameters' `.grad` taken now, restored by `restore` (a measured or recorded step leaves
    no trace)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rng = torch.get_rng_state()
        devices = {t.device for t in (*model.parameters(), *model.buffers())}
        cuda = [generator(d) for d in devices if d.type == "cuda"]
        self.device_rngs = [(g, g.get_state()) for g in cuda]
        self.buffers = {k: v.clone() for k, v in model.named_buffers()}
        self.grads = {p: p.grad for p in model.parameters()}

    def restore(self) -> None:
        torch.set_rng_state(self.rng)
        for g, state in self.device_rngs:
            g.set_state(state)
        with torch.no_grad():
            for k, v in self.model.named_buffers():
                v.copy_(self.buffers[k])
        for p, g in self.grads.items():
            p.grad = g


def plain_step_peak(
    model: nn.Module, step: Callable[[], object], device: str | torch.device = "cpu"
) -> int:
    """Measured peak bytes of one plain training step ``step()`` (forward and backward, eager,
    nothing checkpointed) above what exists before it, with every ``.grad`` None at its start
    (as after ``optimizer.zero_grad()``), so the gradients it creates count: the 100% of a
    percentage budget. The model's buffers, ``.grad`` and the CPU generator are left as found.
    """
    snapshot = Snapshot(model)
    model.zero_grad(set_to_none=True)
    try:
        return measure_peak(step, device).peak_bytes
    finally:
        snapshot.restore()


def measure_each(
    calls: Sequence[Callable[[], object]], device: str | torch.device = "cpu"
) -> list[PeakMemory]:
    """Run the calls once each, in order; the measured peak of each above the bytes live at its
    own start, with its result still held at its end (``end_bytes`` includes the result).

    One profiler session on CPU (each call in a marked window; a session per call would cost
    milliseconds each), the CUDA allocator's counters on CUDA. Results are dropped after their
    call's window.
    """
    device = torch.device(device)
    measured: list[PeakMemory] = []
    if device.type == "cuda":
        for call in calls:
            torch.cuda.synchronize(device)
            start = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            result = call()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - start
            end = torch.cuda.memory_allocated(device) - start
            del result
            measured.append(PeakMemory(peak, end, "cuda-max-memory-allocated"))
        return measured

    from torch._C._profiler import _RecordFunctionFast

    prefix = "remat.measure_each:"
    with memory_profile() as prof:
        for i, call in enumerate(calls):
            with _RecordFunctionFast(f"{prefix}{i}"):
                result = call()
            del result
    for peak, live in window_peaks(prof, prefix):
        measured.append(PeakMemory(peak, live, "profiler-allocation-events"))
    return measured


def window_peaks(
    prof: torch.profiler.profile, prefix: str, device: torch.device = CPU
) -> list[tuple[int, int]]:
    """(peak, end) bytes allocated on `device` within each window named ``prefix<i>`` (in
    order of i), above the bytes live at its start."""
    events = allocation_events(prof, device)
    out = []
    k = 0
    for start, end in marked_windows(prof, prefix):
        while k < len(events) and events[k][0] < start:
            k += 1
        live = peak = 0
        while k < len(events) and events[k][0] <= end:
            live += events[k][1]
            peak = max(peak, live)
            k += 1
        out.append((peak, live))
    return out


@contextlib.contextmanager
def memory_profile() -> Iterator[torch.profiler.profile]:
    """A profiler session (CPU activity) recording allocations, every allocator's with its
    device (`allocation_events`). Its start and stop, where torch's kineto
    writes a notice line to the process's stderr each time, run with file descriptor 2 on
    the null device, so a command that measures prints only its own lines.

    Every object that exists when the session opens is frozen (`gc.freeze`) for it and the
    collector held off during it: a collection inside it (torch.compile's runs one) would free
    tensors of earlier work held only by reference cycles (a compiled model's copies and their
    gradients), and where such a tensor was allocated in an earlier session the profiler knows
    its size and records the free, which lowers the running sum (the SAC tests after a
    torch.compile test read peaks 3,072 and 12,288 B short). Freezing and unfreezing move the
    collector's lists whole, where a full collection before the session, which also keeps
    them out, costs 0.66 s a measurement on average in a process running the whole test
    suite. Where objects are frozen already (an enclosing session, or the caller's own
    `gc.freeze`), the session leaves the freeze as found and collects instead (the frozen
    objects are not scanned)."""
    from torch.profiler import ProfilerActivity, profile

    freezes = gc.get_freeze_count() == 0
    if freezes:
        gc.freeze()
    else:
        gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    try:
        with _stderr_fd_silenced():
            prof.__enter__()
        try:
            yield prof
        finally:
            with _stderr_fd_silenced():
                prof.__exit__(None, None, None)
    finally:
        if freezes:
            gc.unfreeze()
        if collecting:
            gc.enable()


@contextlib.contextmanager
def _stderr_fd_silenced() -> Iterator[None]:
    """File descriptor 2 on the null device for the block (Python's buffered stderr flushed
    first), restored after it."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)
