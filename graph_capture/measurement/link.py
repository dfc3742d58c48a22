"""The host link per direction, its fixed latency and its bandwidth, measured as offloaded
values cross it.

`measure_host_link` times copies of a few sizes (`link_sizes`: from `MIN_LINK_BYTES` up to
``nbytes``, each four times the one before) each way, takes the median of ``repeats`` copies of
each size after one warm-up copy, and fits ``seconds = latency + bytes / bandwidth`` per
direction (`fit_copy_times`). It returns a `solver.Link` (bytes per second and seconds, the
units of captured graphs' costs):

- CUDA: a device tensor and a pinned host buffer; each copy runs on a side stream (as
  `executor.traced.offload.HostPool`'s copies do) between two CUDA events, and its seconds are
  the events' elapsed time. Device-to-host is the offload direction, host-to-device the reload.
- CPU: a tensor from torch's CPU allocator and a host buffer that numpy allocates, the pair the
  own executor's CPU pool copies between (`HostPool` with ``pinned=False``), timed by the wall
  clock. Both are the same physical memory here, so the figures are this machine's memcpy
  latency and bandwidth, those remat's CPU offload really copies at; not a GPU's link.

The host limit is left unset (None): how much host memory copies may hold is a choice, not a
measurement. The link is duplex (one engine per direction), as the own executor runs it. The
host rounding is the pool's on that device: ``"power-of-two"`` for CUDA's
pinned memory, ``"exact"`` for the CPU's numpy memory (`solver.core.link.HOST_ROUNDINGS`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy
import torch

from graph_capture.measurement.timing import median_seconds
from solver.core.link import Link
from solver.errors import ArgumentError

__all__ = [
    "LINK_BYTES",
    "LINK_REPEATS",
    "MIN_LINK_BYTES",
    "fit_copy_times",
    "link_sizes",
    "measure_host_link",
]

LINK_BYTES = 64 << 20
"""Bytes of the largest timed copy: a PCIe Gen4/Gen5 copy of it takes milliseconds, so its
time is its bandwidth's; the smaller sizes give the latency."""
MIN_LINK_BYTES = 1 << 10
"""Bytes of the smallest timed copy: its time is mostly the copy's fixed latency."""
LINK_REPEATS = 11
"""Timed copies per size and direction (the median is kept)."""


def link_sizes(nbytes: int) -> list[int]:
    """The timed copy sizes up to ``nbytes``: ``nbytes``, a quarter of it, and so on, down to
    `MIN_LINK_BYTES`, which is always one (ascending). ArgumentError below 2 * MIN_LINK_BYTES (a
    fit needs two sizes)."""
    if nbytes < 2 * MIN_LINK_BYTES:
        raise ArgumentError(
            f"the largest timed copy must be at least {2 * MIN_LINK_BYTES} bytes (the latency "
            f"and the bandwidth need two sizes), not {nbytes}"
        )
    sizes = {MIN_LINK_BYTES}
    while nbytes > MIN_LINK_BYTES:
        sizes.add(nbytes)
        nbytes >>= 2
    return sorted(sizes)


def fit_copy_times(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes per second) of ``seconds = latency + bytes /
    bandwidth`` fitted to copies of ``sizes`` bytes that took ``seconds``: least squares of the
    relative error (each time's noise grows with the time, so a plain fit would let the largest
    copies decide the latency), the latency held at 0 where the free fit puts it below.
    ArgumentError where the times do not grow with the size (no bandwidth: measure again on an idle
    machine)."""
    n = numpy.asarray(sizes, dtype=float)
    t = numpy.asarray(seconds, dtype=float)
    if n.shape != t.shape or len(set(sizes)) < 2 or not (t > 0).all():
        raise ArgumentError(
            f"a fit needs two sizes or more and a positive time per size, not {sizes} bytes "
            f"in {seconds} s"
        )
    # minimise sum ((latency + n / bandwidth) / t - 1)^2
    (latency, per_byte), *_ = numpy.linalg.lstsq(
        numpy.stack([1 / t, n / t], axis=1), numpy.ones_like(t), rcond=None
    )
    if latency < 0:
        latency, per_byte = 0.0, float((n / t).sum() / ((n / t) ** 2).sum())
    if not per_byte > 0:
        raise ArgumentError(
            f"copy times {seconds} s of {sizes} bytes do not grow with the size: no bandwidth "
            "to fit; measure again on an idle machine"
        )
    return float(latency), float(1 / per_byte)


def measure_host_link(
    device: torch.device | str = "cpu", nbytes: int = LINK_BYTES, repeats: int = LINK_REPEATS
) -> Link:
    """The measured link between ``device``'s memory and host memory: per direction, the
    latency and bandwidth fitted to the median seconds of ``repeats`` copies of each of
    `link_sizes`\\(``nbytes``). ``device`` is ``"cpu"`` or a CUDA device; ArgumentError for another
    device, where CUDA is asked for and absent, or for too small an ``nbytes``."""
    device = torch.device(device)
    if repeats < 1:
        raise ArgumentError(f"repeats must be at least 1, not {repeats}")
    sizes = link_sizes(nbytes)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(
                "no CUDA device here: measure the host link on the GPU machine, or measure "
                "this machine's CPU copy with device 'cpu'"
            )
        times = [_cuda_seconds(device, size, repeats) for size in sizes]
    elif device.type == "cpu":
        times = [_cpu_seconds(size, repeats) for size in sizes]
    else:
        raise ArgumentError(f"host links are measured on 'cpu' or a CUDA device, not {device}")
    d2h_latency, d2h = fit_copy_times(sizes, [d2h for d2h, _ in times])
    h2d_latency, h2d = fit_copy_times(sizes, [h2d for _, h2d in times])
    rounding = "power-of-two" if device.type == "cuda" else "exact"  # pinned, or numpy's
    return Link(
        d2h=d2h,
        h2d=h2d,
        d2h_latency=d2h_latency,
        h2d_latency=h2d_latency,
        host_rounding=rounding,
    )


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
