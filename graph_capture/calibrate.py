"""Make the measured op times add up to the training step they model.

Each op is timed alone (`graph_capture.measure`: least of repeated runs on the same inputs).
Two things a step spends beyond those times are measured here and put into the ops' seconds:

- `add_accumulation_seconds`: adding each parameter gradient into an existing ``.grad``
  (autograd's AccumulateGrad, and the executor, do it once per step), charged to the op that
  computes the gradient;
- `calibrate_to_plain_run`: the whole graph run once in order (values freed after their last
  use, as a training step frees them) takes longer than the sum of its ops timed alone: the
  backward ops read tensors saved long before, which are no longer in cache. The difference is
  spread over the backward ops in proportion to their times. Forward ops, the ones schedules
  recompute, keep their own times: the extra time recomputation measured in real steps matched
  them (``python -m benchmarks.real_models``: predicted vs measured overhead).

So the node costs sum to one plain step, and "cost of computing each node once" is the step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from graph_capture.device import fork_rng, synchronize
from graph_capture.fx_nodes import phase_of
from graph_capture.measure import NodeMeasure

__all__ = ["add_accumulation_seconds", "calibrate_to_plain_run"]


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
) -> None:
    """Add to the op computing each parameter gradient (output position in `grad_positions`)
    the least of `repeats` timed adds of it into a tensor of its shape."""
    (output,) = gm.graph.find_nodes(op="output")
    for position in grad_positions:
        node = output.args[0][position]
        grad = outputs[position]
        if not isinstance(node, torch.fx.Node) or node.name not in measures:
            continue
        buffer = torch.zeros_like(grad)
        measures[node.name].seconds += _least_seconds(
            lambda b=buffer, g=grad: b.add_(g), grad.device, repeats
        )


def calibrate_to_plain_run(
    gm: torch.fx.GraphModule,
    args: Sequence[torch.Tensor],
    measures: dict[str, NodeMeasure],
    device: torch.device,
    repeats: int,
) -> float:
    """Scale the backward ops' seconds so that every op's seconds (accumulation excluded) sum
    to the least of `repeats` plain runs of `gm` on `args` (under ``no_grad``, the RNG state
    restored); returns that plain run's seconds. Ops never get faster: a plain run quicker than
    the sum leaves the times as they are."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    with fork_rng(device), torch.no_grad():
        gm(*args)  # warm-up
        plain = _least_seconds(lambda: gm(*args), device, repeats)
    backward = [measures[n.name] for n in nodes if phase_of(n) == "backward"]
    behind = plain - sum(measures[n.name].seconds for n in nodes)
    spread = sum(m.seconds for m in backward)
    if behind > 0 and spread > 0:
        for measure in backward:
            measure.seconds *= 1 + behind / spread
    return plain
