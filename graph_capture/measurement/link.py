"""The host link's bandwidth per direction, measured as offloaded values cross it.

`measure_host_link` times copies of one buffer of ``nbytes`` bytes each way and returns a
`solver.Link` (bytes per second, the unit of captured graphs' costs), the median of
``repeats`` copies after one warm-up copy per direction:

- CUDA: a device tensor and a pinned host buffer; each copy runs on a side stream (as
  `executor.traced.offload.HostPool`'s copies do) between two CUDA events, and its seconds are
  the events' elapsed time. Device-to-host is the offload direction, host-to-device the reload.
- CPU: a tensor from torch's CPU allocator and a host buffer that numpy allocates, the pair the
  own executor's CPU pool copies between (`HostPool` with ``pinned=False``), timed by the wall
  clock. Both are the same physical memory here, so the figure is this machine's memcpy
  bandwidth, the rate remat's CPU offload really copies at; it is not a GPU's link.

The host limit is left unset (None): how much host memory copies may hold is a choice, not a
measurement. The host rounding is the pool's on that device: ``"power-of-two"`` for CUDA's
pinned memory, ``"exact"`` for the CPU's numpy memory (`solver.core.link.HOST_ROUNDINGS`).
"""

from __future__ import annotations

import statistics

import numpy
import torch

from graph_capture.measurement.timing import median_seconds
from solver.core.link import Link
from solver.errors import ArgumentError

__all__ = ["LINK_BYTES", "LINK_REPEATS", "measure_host_link"]

LINK_BYTES = 256 << 20
"""Bytes copied per timed copy: large enough that a copy's fixed cost (a launch, a
synchronisation; microseconds) is well under 1% of a PCIe Gen4/Gen5 copy's time."""
LINK_REPEATS = 11
"""Timed copies per direction (the median is kept)."""


def measure_host_link(
    device: torch.device | str = "cpu", nbytes: int = LINK_BYTES, repeats: int = LINK_REPEATS
) -> Link:
    """The measured link between ``device``'s memory and host memory: the median bytes per
    second of ``repeats`` copies of ``nbytes`` bytes each way. ``device`` is ``"cpu"`` or a
    CUDA device; ArgumentError for another device or where CUDA is asked for and absent."""
    device = torch.device(device)
    if nbytes < 1 or repeats < 1:
        raise ArgumentError(f"nbytes and repeats must be at least 1, not {nbytes} and {repeats}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(
                "no CUDA device here: measure the host link on the GPU machine, or measure "
                "this machine's CPU copy with device 'cpu'"
            )
        d2h, h2d = _cuda_seconds(device, nbytes, repeats)
    elif device.type == "cpu":
        d2h, h2d = _cpu_seconds(nbytes, repeats)
    else:
        raise ArgumentError(f"host links are measured on 'cpu' or a CUDA device, not {device}")
    rounding = "power-of-two" if device.type == "cuda" else "exact"  # pinned, or numpy's
    return Link(d2h=nbytes / d2h, h2d=nbytes / h2d, host_rounding=rounding)


def _cpu_seconds(nbytes: int, repeats: int) -> tuple[float, float]:
    """Median wall seconds of a copy torch tensor -> numpy buffer, and back."""
    tensor = torch.ones(nbytes, dtype=torch.uint8)
    host = torch.from_numpy(numpy.empty(nbytes, dtype=numpy.uint8))
    d2h = median_seconds(lambda: host.copy_(tensor), repeats=repeats, warmup=1)
    return d2h, median_seconds(lambda: tensor.copy_(host), repeats=repeats, warmup=1)


def _cuda_seconds(device: torch.device, nbytes: int, repeats: int) -> tuple[float, float]:
    """Median seconds (CUDA events) of a copy device -> pinned host on a side stream, and back."""
    tensor = torch.ones(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))

    def timed(dst: torch.Tensor, src: torch.Tensor) -> float:
        times = []
        with torch.cuda.stream(stream):
            for _ in range(repeats + 1):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                dst.copy_(src, non_blocking=True)
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)  # milliseconds -> seconds
        return statistics.median(times[1:])

    return timed(host, tensor), timed(tensor, host)
