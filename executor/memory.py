"""Measured peak memory and step time.

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

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from graph_capture.device import fork_rng, no_autocast

__all__ = ["PeakMemory", "measure_peak", "median_seconds", "op_scratch_bytes"]


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


def _alloc_sizes_in_order(prof: torch.profiler.profile) -> list[int]:
    from torch._C._profiler import _EventType

    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    events.sort(key=lambda e: e[0])
    return [size for _, size in events]


def measure_peak(fn: Callable[[], object], device: str | torch.device = "cpu") -> PeakMemory:
    """Run ``fn()`` once and return its measured peak memory in bytes above the start.

    The result of ``fn`` is dropped before the end is read, so ``end_bytes`` counts only what
    ``fn`` left behind elsewhere (e.g. new ``.grad`` tensors).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        del result
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - start
        end = torch.cuda.memory_allocated(device) - start
        return PeakMemory(peak, end, "cuda-max-memory-allocated")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
        del result
    live = peak = 0
    for size in _alloc_sizes_in_order(prof):
        live += size
        peak = max(peak, live)
    return PeakMemory(peak, live, "profiler-allocation-events")


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_scratch_bytes(graph_module: torch.fx.GraphModule, args: Sequence[object]) -> dict[str, int]:
    """Measured scratch of every op: fx node name -> bytes it allocates beyond its output.

    Runs the graph once, node by node (under `torch.no_grad`, autocast off, with the global RNG
    restored afterwards), measuring each node with `measure_peak` on the device of the args
    (the model's): scratch = peak - bytes still held after the node (its output). The solver's
    `mem` counts outputs only, so a schedule's measured peak may exceed its prediction by at
    most the largest scratch of an op running at the peak: `max(op_scratch_bytes(...).values())`
    is the allowance the executor's tests use.
    """
    values: dict[str, object] = {}
    placeholders = iter(args)
    scratch: dict[str, int] = {}
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    with fork_rng(device), torch.no_grad(), no_autocast(device.type):
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                values[node.name] = next(placeholders)
                continue
            if node.op == "output":
                continue
            call_args = torch.fx.node.map_arg(node.args, lambda n: values[n.name])
            call_kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: values[n.name])

            def run(node: torch.fx.Node = node, a: object = call_args, k: object = call_kwargs):
                values[node.name] = node.target(*a, **k)

            measured = measure_peak(run, device)
            scratch[node.name] = measured.peak_bytes - measured.end_bytes
    return scratch
