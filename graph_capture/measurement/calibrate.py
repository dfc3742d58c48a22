"""What a training step spends for an op beyond the op itself, added to the op's seconds.

`graph_capture.measurement.measure` times each op where a step runs it (the graph in order, each
value dropped after its last use). A step also adds each parameter gradient into an existing
``.grad`` (autograd's AccumulateGrad, and the executor, do it once per step):
`add_accumulation_seconds` charges that add to the op computing the gradient. So the node
costs sum to the ops' share of one step (each the least of its samples); what a step spends
between ops (Python dispatch, bookkeeping) is in no node's cost, but in the graph's measured
``step_cost`` (`graph_capture.capture`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from graph_capture.measurement.device import synchronize
from graph_capture.measurement.measure import NodeMeasure

__all__ = ["add_accumulation_seconds", "add_per_gradient"]


def _least_seconds(call, device: torch.device, repeats: int) -> float:
    seconds = []
    for _ in range(max(1, repeats)):
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def add_accumulation_seconds(
    gm: torch.fx.GraphModule,
    grad_positions: Sequence[int],
    outputs: Sequence[object],
    measures: dict[str, NodeMeasure],
    repeats: int,
) -> float:
    """Add to the op computing each parameter gradient (output position in `grad_positions`)
    the least of `repeats` timed adds of it into a tensor of its shape; returns the seconds
    added in all."""

    def timed_add(grad: torch.Tensor) -> float:
        buffer = torch.zeros_like(grad)
        return _least_seconds(lambda: buffer.add_(grad), grad.device, repeats)

    return add_per_gradient(gm, grad_positions, outputs, measures, timed_add)


def add_per_gradient(
    gm: torch.fx.GraphModule,
    grad_positions: Sequence[int],
    outputs: Sequence[object],
    measures: dict[str, NodeMeasure],
    seconds_of: Callable[[torch.Tensor], float],
) -> float:
    """Add `seconds_of(gradient)` to the measure of the op computing each parameter gradient
    (output position of `gm` in `grad_positions`, its value in `outputs`), in order; returns
    the seconds added in all."""
    (output,) = gm.graph.find_nodes(op="output")
    added = 0.0
    for position in grad_positions:
        node = output.args[0][position]
        if not isinstance(node, torch.fx.Node) or node.name not in measures:
            continue
        seconds = seconds_of(outputs[position])
        measures[node.name].seconds += seconds
        added += seconds
    return added
