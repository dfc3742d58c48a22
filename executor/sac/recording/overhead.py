"""Per region, the prices of running it inside checkpoint (`measure_overhead`): seconds a
training step pays for running a region under a SAC policy rather than under plain checkpoint,
and under plain checkpoint rather than without."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError

from executor.errors import PlanError
from executor.sac.recording.alike import region_inputs
from executor.sac.recording.measurer import DeviceMeter, Measurer
from executor.sac.recording.region_timing import RegionTimes
from executor.sac.runtime.policy import Policy
from executor.sac.step import LossClosure, RecordingTime, Snapshot
from solver.sac import SacBlock


def _refused_by_checkpoint(error: RuntimeError) -> bool:
    """Whether `error` is autograd's or checkpoint's refusal of the region (an input or saved
    tensor modified in place, a recompute saving other tensors), not out of memory or a bug."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    return isinstance(error, CheckpointError) or "modified by an inplace operation" in str(error)


class Stream(NamedTuple):
    """A region's recorded forward op stream: op names, each op's seconds, and `stop` (the op
    after which a recompute ends)."""

    ops: tuple[str, ...]
    seconds: tuple[float, ...]
    stop: int


def measure_overhead(
    model: nn.Module,
    regions: Sequence[nn.Module],
    streams: Sequence[Stream],
    step: LossClosure,
    repeats: int = 5,
    clock: RecordingTime | None = None,
    measurer: Measurer | None = None,
    calls: list | None = None,
) -> list[RegionTimes | RuntimeError]:
    """Per region, the seconds a training step pays (`RegionTimes`) for running it under a SAC
    policy rather than under plain checkpoint (`overhead`: the policy's dispatch modes in its
    forward and its recompute and the op-stream check, `executor.sac.runtime.policy.Policy`
    recomputing every op, the same recompute as plain checkpoint's), and for running it under
    plain checkpoint rather than without (`checkpoint`: the recompute and checkpoint's own
    machinery: saving inputs and RNG state, the recompute's Python, the unpack hooks). Each
    region runs alone, forward and backward, on the inputs it gets in the step (`streams`: its
    recorded op stream, which the policy checks), the three ways side by side: after one
    warm-up of each, `repeats` rounds, the order rotated each round; the medians of the
    rounds' differences; fewer rounds (at least one) where `clock` leaves no time for more,
    its spare time shared evenly by the regions still to time. The thread count is the
    caller's. For a region that autograd or
    checkpoint refuses inside checkpoint, its error (a module that writes its input in place,
    such as an in-place ReLU, invalidates the input checkpoint keeps); any other error
    (out of memory, a bug) propagates. `measurer` (default `Measurer`) times each region;
    in estimate mode it predicts them (`executor.sac.recording.estimate.Estimate.region_times`).
    `calls`: each region's inputs (`region_inputs`), where the caller has them.
    """
    clock = clock or RecordingTime()
    measurer = measurer or Measurer()
    calls = calls if calls is not None else region_inputs(model, regions, step)
    snapshot = Snapshot(model)
    out: list[RegionTimes | None] = []
    try:
        for j, (module, call) in enumerate(zip(regions, calls, strict=True)):
            if call is None:
                raise PlanError(f"region {j} ({type(module).__name__}) is not called by the step")

            try:
                rounds = clock.repeats(repeats, clock.spare.share(1 / (len(regions) - j)))
                out.append(measurer.region_times(module, call, f"region {j}", streams[j], rounds))
            except RuntimeError as e:
                if not _refused_by_checkpoint(e):
                    raise
                out.append(e)
    finally:
        snapshot.restore()
    return out


def pooled(
    times: list[RegionTimes | RuntimeError], kinds: list
) -> list[RegionTimes | RuntimeError]:
    """`times` with each region's `checkpoint` the median over the regions of its kind (module
    class and op stream: the same work, timed alone several times over), which halves or more
    the spread of one region's median on a shared machine."""
    groups: dict = {}
    for t, kind in zip(times, kinds, strict=True):
        if isinstance(t, RegionTimes):
            groups.setdefault(kind, []).append(t.checkpoint)
    return [
        t if isinstance(t, RuntimeError) else t._replace(checkpoint=statistics.median(groups[kind]))
        for t, kind in zip(times, kinds, strict=True)
    ]


def priced(block: SacBlock, times: RegionTimes | RuntimeError) -> SacBlock | None:
    """The block with its measured `overhead` and `price`, so that the modelled cost of the
    region recomputing every op is plain checkpoint's measured price: where that exceeds the
    recorded seconds of the ops a full recompute reruns (up to `stop`), `price` is the excess;
    where it is less (the recorded seconds, timed one op at a time, overestimate the rerun),
    those ops' seconds are scaled down to it and `price` is 0, so that a region saving some
    ops never costs less than the ops it reruns. None where the region fails inside
    checkpoint (`times` its error)."""
    if isinstance(times, RuntimeError):
        return None
    recompute = sum(op.seconds for op in block.ops[: block.stop + 1])
    if times.checkpoint >= recompute or recompute <= 0:
        price = max(times.checkpoint - recompute, 0.0)  # below 0 only within the timing's noise
        return replace(block, overhead=times.overhead, price=price)
    scale = max(times.checkpoint, 0.0) / recompute
    ops = tuple(
        replace(op, seconds=op.seconds * scale) if i <= block.stop else op
        for i, op in enumerate(block.ops)
    )
    return replace(block, ops=ops, overhead=times.overhead, price=0.0)


def measure_offload_seconds(rounds: int = 60, meter: DeviceMeter | None = None) -> float:
    """Seconds the runtime spends per offloaded op besides its copies (`SacProblem.
    offload_seconds`): a 4-op region (two matmuls and tanh, 16 KiB outputs) inside
    checkpoint, forward and backward, its 4 ops saved and offloaded against saved and kept,
    the two interleaved `rounds` times; the difference of the medians over 4, at least 0.
    Measured on `meter`'s device (default the CPU; the plan's, `checkpoint_plan`), timed by
    `DeviceMeter.now`: the runtime's Python (the pack, the cache entry's swap, the reload's
    issue and read) and the small copies, on CUDA the runtime's own (into pinned host memory
    on its copy streams, `executor.sac.runtime.offload.CopyStreams`), the device synchronized
    before each read of the clock."""
    meter = meter or DeviceMeter()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 32, generator=generator).to(meter.device).requires_grad_()
    w = torch.randn(32, 32, generator=generator).to(meter.device).requires_grad_()
    ops = ("aten.mm.default", "aten.tanh.default", "aten.mm.default", "aten.tanh.default")
    every = frozenset(range(len(ops)))
    policies = {
        "kept": Policy("probe", ops, every),
        "offloaded": Policy("probe", ops, every, every),
    }

    def region(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.tanh(a @ b) @ b)

    times: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(rounds):
        for name, policy in policies.items():
            start = meter.now()
            out = torch.utils.checkpoint.checkpoint(
                region, x, w, use_reentrant=False, context_fn=policy.contexts
            )
            out.sum().backward()
            times[name].append(meter.now() - start)
    extra = statistics.median(times["offloaded"]) - statistics.median(times["kept"])
    return max(extra, 0.0) / len(ops)
