"""Estimate mode: a training step's bytes and seconds from fake tensors, for a target device.

No real step runs. The model's parameters and buffers are swapped for fake tensors (no data;
a model built on the meta device works, and a real model's weights are never read) while the
step is traced, then the joint graph runs node by node under the same `FakeTensorMode`:

- bytes: each value's fake storages, with the same accounting `measure.measure_joint` applies
  to real ones (every value kept, a storage counted once, new storages per node), each storage
  rounded up as the target's allocator rounds a block (`solver.target.Device.round_bytes`);
- scratch bytes (kernel workspaces, temporaries inside one aten op), which fake tensors do not
  show, come from the target's workspace model (`graph_capture.measurement.workspace`);
- seconds: the target's measured table where it has the op (``remat calibrate``), else the
  op's roofline (`graph_capture.measurement.roofline.op_seconds`); a parameter gradient's node
  also pays the add into ``.grad``.

The fake tensors live on the CPU (a model on the meta device is traced as the CPU model it
stands for: the meta device has no kernels for some ops' autograd, and the graph must be the one
the real capture traces), so the graph is the one the measured capture of the same model traces.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from graph_capture.errors import CaptureError
from graph_capture.measurement.calibrate import add_per_gradient
from graph_capture.measurement.measure import (
    JointMeasure,
    NodeMeasure,
    estimate_flops,
    interpret,
    shapes_of,
    storages_of,
)
from graph_capture.measurement.roofline import op_flops, op_seconds
from graph_capture.measurement.workspace import workspace_bytes
from graph_capture.trace.fx_nodes import describe_op
from graph_capture.trace.lifted import LiftedConstant
from solver.deadline import NEVER, Deadline
from solver.target import Device

__all__ = ["CUDA_GENERATOR_STATE_BYTES", "FakeStep", "estimate_joint", "fake_step"]

CUDA_GENERATOR_STATE_BYTES = 16
"""Bytes of a CUDA generator's saved state (Philox seed and offset)."""

CONSTANT_BYTES = 64 << 10
"""The most bytes of tensors a forward may build from Python data (``torch.tensor`` of a list,
``torch.from_numpy``: lifted constants, real memory allocated while tracing) in estimate mode."""


@dataclass
class FakeStep:
    """The fake tensor mode of an estimate and the example inputs as fake tensors."""

    mode: FakeTensorMode
    inputs: tuple[torch.Tensor, ...]
    kwargs: dict[str, torch.Tensor]

    def fake(self, tensor: torch.Tensor) -> torch.Tensor:
        """A fake CPU tensor of ``tensor``'s shape, strides, dtype and requires_grad."""
        with self.mode:
            fake = torch.empty_strided(
                tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu"
            )
        return fake.requires_grad_(tensor.requires_grad)


@contextlib.contextmanager
def fake_step(
    model: nn.Module, inputs: Sequence[torch.Tensor], kwargs: Mapping[str, torch.Tensor]
) -> Iterator[FakeStep]:
    """While inside: ``model``'s parameters and buffers are fake CPU tensors (tied ones stay
    tied, ``requires_grad`` kept); the model's own tensors are put back on exit. Raises
    `CaptureError` for a model or input on a device other than the CPU or meta."""
    named = [(f"example input {i}", x) for i, x in enumerate(inputs)]
    named += [(f"example keyword input '{k}'", x) for k, x in kwargs.items()]
    named += [(f"parameter '{n}'", p) for n, p in model.named_parameters()]
    for what, x in named:
        if isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta"):
            raise CaptureError(
                f"{what} is on {x.device}: estimate mode traces on the CPU build's fake "
                "tensors; build the model and inputs on the meta device (or the CPU)"
            )
    step = FakeStep(FakeTensorMode(), (), {})
    step.inputs = tuple(step.fake(x) if isinstance(x, torch.Tensor) else x for x in inputs)
    step.kwargs = {k: step.fake(x) if isinstance(x, torch.Tensor) else x for k, x in kwargs.items()}
    swapped: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict, str, torch.Tensor]] = []
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in list(table.items()):
                if tensor is None:
                    continue
                if id(tensor) not in swapped:
                    fake = step.fake(tensor.detach()).requires_grad_(False)
                    if isinstance(tensor, nn.Parameter):
                        fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
                    swapped[id(tensor)] = fake
                saved.append((table, name, tensor))
                table[name] = swapped[id(tensor)]
    try:
        yield step
    finally:
        for table, name, tensor in saved:
            table[name] = tensor


def estimate_joint(
    gm: torch.fx.GraphModule,
    args: Sequence[torch.Tensor],
    device: Device,
    mode: FakeTensorMode,
    grad_positions: Sequence[int],
    deadline: Deadline = NEVER,
) -> JointMeasure:
    """`measure.measure_joint`'s `JointMeasure` for ``device``, from fake tensors (``args``:
    the joint's fake placeholders, made in ``mode``). Each node's ``seconds`` is its predicted
    time; ``pass_seconds`` is their sum (the predicted step: what runs between ops is not
    modelled). A lifted constant is static memory, like a placeholder. Raises `CaptureError`
    naming an op that fails on the fake tensors, and `DeadlineError` before an op once
    ``deadline`` has passed."""
    rounding = device.rounding
    lifted = [n for n in gm.graph.nodes if isinstance(n.target, LiftedConstant)]
    _check_constants(lifted)
    constants = {n.name: mode.from_tensor(n.target.value, static_shapes=True) for n in lifted}

    def run_node(node: torch.fx.Node, args: tuple, kwargs: dict) -> tuple[object, NodeMeasure]:
        if node.name in constants:
            value = constants[node.name]
            return value, NodeMeasure(storages_of(value, rounding), set(), 0.0, 0, 0)
        return _estimate_node(node, args, kwargs, device)

    with mode, torch.no_grad():
        _, measures, outputs = interpret(
            gm,
            args,
            run_node,
            partial(storages_of, rounding=rounding),
            static=list(constants.values()),
            on="fake tensors",
            deadline=deadline,
        )
        total = sum(measure.seconds for measure in measures.values())
        total += _accumulation_seconds(gm, grad_positions, outputs, measures, device)
    return JointMeasure(measures, outputs, total)


def _estimate_node(
    node: torch.fx.Node, args: tuple, kwargs: dict, device: Device
) -> tuple[object, NodeMeasure]:
    target = node.target
    value = target(*args, **kwargs)
    storages = storages_of(value, device.rounding)
    if target is operator.getitem:
        return value, NodeMeasure(storages, set(), 0.0, 0, 0, *shapes_of(value))
    counted = op_flops(target, args, kwargs, value)
    allocates = any(k not in storages_of((args, kwargs)) for k in storages)
    flops = counted or (estimate_flops((args, kwargs), value) if allocates else 0)
    seconds = op_seconds(device, target, args, kwargs, value)
    scratch = workspace_bytes(device, target, args, kwargs, value)
    return value, NodeMeasure(
        storages, set(), seconds, counted, flops, *shapes_of(value), scratch_bytes=scratch
    )


def _check_constants(lifted: Sequence[torch.fx.Node]) -> None:
    """Refuse more than `CONSTANT_BYTES` of tensors built from Python data: estimate mode
    allocates no real memory for the model."""
    nbytes = sum(n.target.value.nbytes for n in lifted)
    if nbytes > CONSTANT_BYTES:
        largest = max(lifted, key=lambda n: n.target.value.nbytes)
        raise CaptureError(
            f"the forward builds {nbytes} bytes of tensors from Python data (largest: "
            f"{tuple(largest.target.value.shape)} for {describe_op(next(iter(largest.users)))}"
            f"), real memory allocated while tracing; estimate mode allocates none for the "
            f"model (at most {CONSTANT_BYTES} bytes): build them with torch factories "
            "(torch.zeros, torch.arange) or register them as buffers"
        )


def _accumulation_seconds(
    gm: torch.fx.GraphModule,
    grad_positions: Sequence[int],
    outputs: Sequence[object],
    measures: dict[str, NodeMeasure],
    device: Device,
) -> float:
    """Add to each parameter gradient's node the predicted seconds of adding it into
    ``.grad`` (`graph_capture.measurement.calibrate` measures the same add); returns the sum."""
    add = torch.ops.aten.add_.Tensor

    def predicted_add(grad: torch.Tensor) -> float:
        into = torch.empty_like(grad)  # fake: ``mode`` is on
        return op_seconds(device, add, (into, grad), {}, into)

    return add_per_gradient(gm, grad_positions, outputs, measures, predicted_add)
