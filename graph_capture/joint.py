"""The joint graph of a training step, ready to run: `trace_step` traces it (`trace_joint`),
reads its placeholder and output layout from AOTAutograd's descriptors, specialises it for the
outputs with a known-zero gradient and makes its tangents and arguments (`Joint`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from graph_capture.errors import CaptureError
from graph_capture.tensor_spec import TensorSpec
from graph_capture.trace.trace import TracedJoint, trace_joint
from graph_capture.trace.zero_tangents import (
    OutputName,
    default_tangents,
    fold_zero_tangent_adds,
    selected_outputs,
)


@dataclass(frozen=True)
class Joint:
    """A traced joint graph and the arguments that run it: ``args`` are its placeholders'
    values in order (parameters, buffers, detached inputs, ``tangents``); ``zero_outputs`` the
    forward output positions whose tangent is known zero."""

    traced: TracedJoint
    layout: dict
    output_specs: list[TensorSpec]
    zero_outputs: list[int]
    tangents: list[torch.Tensor]
    args: list[torch.Tensor]

    @property
    def gm(self) -> torch.fx.GraphModule:
        return self.traced.graph_module

    @property
    def grad_positions(self) -> list[int]:
        """The flat output positions of the parameters' gradients."""
        return list(self.layout["param_grad_indices"].values())


def trace_step(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    backward_from: Sequence[OutputName] | None,
    tensor_mode: contextlib.AbstractContextManager,
    values: tuple[Sequence[torch.Tensor], Mapping[str, torch.Tensor]] | None = None,
) -> Joint:
    """The joint graph of ``model(*inputs, **kwargs)`` (`trace_joint`; ``values``: the real
    inputs where these are an estimate's fakes), its layout
    (`_layout`), with the adds of known-zero tangents folded away (`fold_zero_tangent_adds`),
    the tangents (ones, zeros where known zero) made under ``tensor_mode`` (an estimate's fake
    mode, or a null context) and the arguments that run it."""
    traced = trace_joint(model, inputs, kwargs, values)
    layout = _layout(traced, model)
    gm = traced.graph_module
    output_specs = _output_specs(gm, layout["forward_output_indices"])
    zero_outputs = _zero_tangent_outputs(traced, layout, backward_from)
    tangent_of = dict(
        zip(layout["tangent_output_indices"], layout["tangent_placeholders"], strict=True)
    )
    fold_zero_tangent_adds(gm, [tangent_of[k] for k in zero_outputs])
    with tensor_mode:
        tangents = default_tangents(
            gm,
            layout["tangent_placeholders"],
            layout["tangent_output_indices"],
            output_specs,
            zero_outputs,
        )
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    args = (
        [params[n] for n in layout["param_names"]]
        + [buffers[n] for n in layout["buffer_names"]]
        + [x.detach() for x in [*inputs, *kwargs.values()]]
        + tangents
    )
    return Joint(traced, layout, output_specs, zero_outputs, tangents, args)


def _layout(traced: TracedJoint, model: nn.Module) -> dict:
    """Read the placeholder and output layout from AOTAutograd's descriptors."""
    placeholders = [n.name for n in traced.graph_module.graph.find_nodes(op="placeholder")]
    kinds: dict[str, list] = {"param": [], "buffer": [], "input": [], "tangent": []}
    for name, desc in zip(placeholders, traced.input_descs, strict=True):
        kind = type(desc).__name__
        if kind == "ParamAOTInput":
            kinds["param"].append((name, desc.target))
        elif kind == "BufferAOTInput":
            kinds["buffer"].append((name, desc.target))
        elif kind == "PlainAOTInput":
            kinds["input"].append((name, desc.idx))
        elif kind == "TangentAOTInput" and type(desc.output).__name__ == "PlainAOTOutput":
            kinds["tangent"].append((name, desc.output.idx))
        else:
            raise CaptureError(f"unsupported joint-graph input {desc} (placeholder '{name}')")
    if [idx for _, idx in kinds["input"]] != list(range(len(kinds["input"]))):
        raise CaptureError(f"joint-graph inputs out of order: {kinds['input']}")
    param_names = [t for _, t in kinds["param"]]
    if param_names != [n for n, _ in model.named_parameters()]:
        raise CaptureError("joint-graph parameters are not in model.named_parameters() order")
    layout = {
        "param_names": param_names,
        "param_placeholders": [n for n, _ in kinds["param"]],
        "buffer_names": [t for _, t in kinds["buffer"]],
        "buffer_placeholders": [n for n, _ in kinds["buffer"]],
        "input_placeholders": [n for n, _ in kinds["input"]],
        "tangent_placeholders": [n for n, _ in kinds["tangent"]],
        "tangent_output_indices": [i for _, i in kinds["tangent"]],
        "forward_output_indices": [],
        "buffer_update_indices": {},
        "param_grad_indices": {},
        "input_grad_indices": {},
    }
    for position, desc in enumerate(traced.output_descs):
        kind = type(desc).__name__
        if kind == "PlainAOTOutput":
            if desc.idx != len(layout["forward_output_indices"]):
                raise CaptureError(f"forward outputs out of order at {desc}")
            layout["forward_output_indices"].append(position)
        elif kind == "InputMutationAOTOutput":
            mutated = desc.mutated_input
            if type(mutated).__name__ != "BufferAOTInput":
                what = (
                    f"its input {mutated.idx}"
                    if type(mutated).__name__ == "PlainAOTInput"
                    else f"{mutated}"
                )
                raise CaptureError(
                    f"the model mutates {what} in place (only buffers such as BatchNorm "
                    "running statistics may be mutated): clone it before modifying"
                )
            layout["buffer_update_indices"][mutated.target] = position
        elif kind == "GradAOTOutput":
            of = desc.grad_of
            if type(of).__name__ == "ParamAOTInput":
                layout["param_grad_indices"][of.target] = position
            elif type(of).__name__ == "PlainAOTInput":
                layout["input_grad_indices"][of.idx] = position
        elif desc is not None:
            raise CaptureError(
                f"unsupported joint-graph output {desc} (an output aliasing an input or an "
                "intermediate's base?): return fresh tensors, e.g. .clone()"
            )
    return layout


def _zero_tangent_outputs(
    traced: TracedJoint, layout: dict, backward_from: Sequence[OutputName] | None
) -> list[int]:
    """Forward output positions with a tangent that are not under ``backward_from``'s names
    (none when it is None). Raises `CaptureError` when it selects no output with a tangent."""
    if backward_from is None:
        return []
    if isinstance(backward_from, str | int):
        backward_from = [backward_from]
    selected = selected_outputs(traced.output_treespec, backward_from)
    with_tangent = layout["tangent_output_indices"]
    if not any(k in selected for k in with_tangent):
        raise CaptureError(
            f"backward_from={list(backward_from)} selects no output that requires grad "
            f"(outputs with a gradient: {with_tangent}); name the loss"
        )
    return [k for k in with_tangent if k not in selected]


def _output_specs(gm: torch.fx.GraphModule, forward_positions: list[int]) -> list[TensorSpec]:
    (output,) = gm.graph.find_nodes(op="output")
    specs = []
    for index, position in enumerate(forward_positions):
        node = output.args[0][position]
        if not isinstance(node, torch.fx.Node):
            raise CaptureError(
                f"forward output {index} is not a tensor ({node!r}); return tensors only"
            )
        val = node.meta["val"]
        specs.append(TensorSpec.of(val))
    return specs
