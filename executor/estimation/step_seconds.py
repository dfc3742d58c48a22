"""A training step's seconds without checkpointing: predicted for a target (the sum of the
target's model of each op's seconds over one fake step, `Estimate.call`), or measured here
(the median wall time of real steps)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS

from executor.sac.recording.estimate import Estimate
from graph_capture.measurement.peak import Snapshot
from graph_capture.measurement.timing import median_seconds
from solver.target import Device


class _Seconds(TorchDispatchMode):
    """Runs each op through `measurer.call` and adds up its predicted seconds; metadata
    queries (`SAC_IGNORED_OPS`: sizes, strides, the device) cost nothing, as in the
    recording."""

    def __init__(self, measurer: Estimate) -> None:
        super().__init__()
        self.measurer = measurer
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SAC_IGNORED_OPS:  # metadata queries: no kernel
            return func(*args, **(kwargs or {}))
        out, seconds = self.measurer.call(func, args, kwargs or {})
        self.seconds += seconds
        return out


def predicted_step_seconds(
    model: nn.Module,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    device: Device,
) -> float:
    """Seconds of one plain step (forward, loss, backward) on `device`: each op's predicted
    seconds (`graph_capture.measurement.roofline.op_seconds`, or the device's measured table),
    summed over a fake step; what runs between ops (Python dispatch) is not counted."""
    measurer = Estimate(device)
    with measurer.running(model, (list(inputs), dict(kwargs))) as (fake_inputs, fake_kwargs):
        timed = _Seconds(measurer)
        with timed:
            loss_fn(model(*fake_inputs, **fake_kwargs)).backward()
    return timed.seconds


def measured_step_seconds(
    model: nn.Module,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    repeats: int = 5,
) -> float:
    """Median wall seconds of `repeats` plain steps here after one warm-up; the model's
    generator states, buffers and gradients are as before."""
    snapshot = Snapshot(model)

    def step() -> None:
        loss_fn(model(*inputs, **kwargs)).backward()

    try:
        return median_seconds(step, repeats=repeats)
    finally:
        snapshot.restore()
