"""One training step of `Rematerialized` (`executor.traced.module`): a `Program` (the captured
graph and one schedule, prepared for one model) run as one `torch.autograd.Function`
(`RematFunction`):

- forward: the schedule's ops up to (not including) the first compute of a node that reads a
  tangent (an incoming output gradient) run in `forward`; the values live at that point stay in
  the step's environment (held by the autograd context), everything else is already freed;
- backward: the rest of the ops (recomputes, backward ops, frees) run in `backward` once the
  output gradients are known.

Parameter gradients go straight into `param.grad` when the schedule computes them (exactly what
autograd's AccumulateGrad does: a new tensor with the parameter's strides when `.grad` is None,
an in-place add otherwise), so a gradient the schedule frees is released like in eager. The
Function returns ``None`` for the parameters; autograd still runs each parameter's
AccumulateGrad node with that undefined gradient, which fires its post hooks (DDP's all-reduce)
and post-accumulate-grad hooks once per step, after `.grad` holds the step's gradient
(docs/training.md, "How DDP sees the gradients"). Input
gradients are returned to autograd. New buffer values (BatchNorm running statistics) are copied
into the model the first time the schedule computes them; recomputes read a snapshot of the
buffer taken at the start of the step, so every recompute sees what the first compute saw.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from executor.errors import BackwardError, UnsupportedScheduleError, UnusedOutputGradientError
from executor.traced.codegen import SliceState, compile_ops
from executor.traced.estimated import FirstStepPeak
from executor.traced.interpreter import ScheduleInterpreter, StepState
from executor.traced.offload import Transfers
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.device import no_autocast
from solver.core.schedule import Op, Schedule

__all__ = ["Program", "RematFunction", "split_ops"]


def split_ops(captured: CapturedGraph, ops: Sequence[Op]) -> int:
    """Index of the first op that computes a DAG node reading a tangent (len(ops) if none).

    Ops before it can run in the autograd forward; the rest need the output gradients.
    Raises UnsupportedScheduleError if a forward output is first computed after that point.
    """
    graph = captured.joint.graph
    needs_tangent: set[str] = set(captured.tangent_placeholders)
    for node in graph.nodes:
        if node.op != "placeholder" and any(a.name in needs_tangent for a in node.all_input_nodes):
            needs_tangent.add(node.name)
    split = next(
        (
            i
            for i, (kind, v) in enumerate(ops)
            if kind == "compute" and any(m in needs_tangent for m in captured.members[v])
        ),
        len(ops),
    )
    output = next(n for n in graph.nodes if n.op == "output").args[0]
    before = {m for kind, v in ops[:split] if kind == "compute" for m in captured.members[v]}
    placeholders = {n.name for n in graph.nodes if n.op == "placeholder"}
    for k, position in enumerate(captured.forward_output_indices):
        name = output[position].name
        if name not in before and name not in placeholders:
            raise UnsupportedScheduleError(
                f"forward output {k} (fx node {name}) is first computed at op "
                f"{_first_compute(captured, ops, name)}, after op {split} already needs output "
                "gradients; compute every forward output before the first backward op"
            )
    return split


def _first_compute(captured: CapturedGraph, ops: Sequence[Op], name: str) -> int | None:
    for i, (kind, v) in enumerate(ops):
        if kind == "compute" and name in captured.members[v]:
            return i
    return None


class Program:
    """A captured graph and one schedule, prepared to run steps on one model."""

    def __init__(
        self, model: nn.Module, captured: CapturedGraph, schedule: Schedule, compiled: bool
    ) -> None:
        self.model = model
        self.captured = captured
        self.schedule = schedule
        # resolved once: a parameter or buffer *object* replaced later is not seen (in-place
        # updates, load_state_dict and .to() keep the objects)
        self.params = [model.get_parameter(n) for n in captured.param_names]
        self.buffers = {n: model.get_buffer(n) for n in captured.buffer_names}
        reloads = Counter(v for kind, v in schedule.ops if kind == "reload")
        self.transfers = (
            None if schedule.link is None else Transfers(self.params[0].device, reloads)
        )
        self.interpreter = ScheduleInterpreter(
            captured.joint, captured.members, captured.random_nodes, self.transfers
        )
        split = split_ops(captured, schedule.ops)
        self.forward_ops = list(schedule.ops[:split])
        self.backward_ops = list(schedule.ops[split:])
        self.run_forward = lambda step: self.interpreter.run(self.forward_ops, step)
        self.run_backward = lambda step: self.interpreter.run(self.backward_ops, step)
        if compiled:
            slots = self.interpreter.slot
            primals = [
                slots[n]
                for n in captured.param_placeholders
                + captured.buffer_placeholders
                + captured.input_placeholders
            ]
            state = SliceState()
            self.run_forward, live = compile_ops(self.interpreter, self.forward_ops, primals, state)
            tangents = [slots[n] for n in captured.tangent_placeholders]
            self.run_backward, _ = compile_ops(
                self.interpreter, self.backward_ops, live | set(tangents), state
            )
        output = next(n for n in captured.joint.graph.nodes if n.op == "output").args[0]
        self.placeholder_results = [
            (position, self.interpreter.slot[node.name])
            for position, node in enumerate(output)
            if isinstance(node, torch.fx.Node) and node.op == "placeholder"
        ]
        index = {n: k for k, n in enumerate(captured.param_names)}
        self.grad_position_to_param = {i: index[n] for n, i in captured.param_grad_indices.items()}
        self.buffer_of_position = {i: n for n, i in captured.buffer_update_indices.items()}
        self.mutated_buffers = set(captured.buffer_update_indices)
        self.kept_positions = set(captured.forward_output_indices) | set(
            captured.input_grad_indices.values()
        )
        solved_in_estimate = "target" in schedule.extra and "target" not in captured.dag.graph
        self.first_step = (
            FirstStepPeak(schedule, self.params[0].device) if solved_in_estimate else None
        )

    def start(self, params: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> StepState:
        """A new step with parameters, buffers (mutated ones snapshotted) and inputs bound."""
        c = self.captured
        step = self.interpreter.new_step()
        buffers = self.buffers
        buffer_values = [
            buffers[n].clone() if n in self.mutated_buffers else buffers[n] for n in c.buffer_names
        ]
        self.interpreter.set_placeholders(step, c.param_placeholders, params)
        self.interpreter.set_placeholders(step, c.buffer_placeholders, buffer_values)
        self.interpreter.set_placeholders(step, c.input_placeholders, inputs)
        step.on_result = self._on_result
        self._record_placeholder_results(step)
        return step

    def forward(self, step: StepState) -> list[torch.Tensor]:
        """Run the forward part; returns the forward outputs. Leaves the RNG where eager would."""
        self.run_forward(step)
        step.rng.finish()
        return [step.results.pop(i) for i in self.captured.forward_output_indices]

    def backward(self, step: StepState, tangents: Sequence[torch.Tensor]) -> dict[int, object]:
        """Run the rest with the output gradients; returns the results (input grads etc.)."""
        self.interpreter.set_placeholders(step, self.captured.tangent_placeholders, tangents)
        self._record_placeholder_results(step)
        self.run_backward(step)
        if self.transfers is not None:
            self.transfers.finish(step.copies)
        results = step.results
        step.env.clear()
        return results

    def tangents(self, grad_outputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """The tangents to bind from autograd's output gradients (None where an output got no
        gradient: `CapturedGraph.missing_tangent`). Raises `UnusedOutputGradientError` when an
        output captured as unused by the loss (``backward_from``) got a nonzero gradient."""
        c = self.captured
        tangents = []
        for i, k in enumerate(c.tangent_output_indices):
            grad = grad_outputs[k]
            if grad is None:
                grad = c.missing_tangent(i)
            elif k in c.zero_tangent_outputs and grad.any():
                raise UnusedOutputGradientError(
                    f"the step backpropagated a nonzero gradient into forward output {k}, "
                    "which the capture was told the loss does not use (backward_from): "
                    "capture with backward_from naming it too"
                )
            tangents.append(grad)
        return tangents

    def _record_placeholder_results(self, step: StepState) -> None:
        for position, slot in self.placeholder_results:
            if position not in step.seen and step.env[slot] is not None:
                step.seen.add(position)
                self._on_result(step, position, step.env[slot])

    def _on_result(self, step: StepState, position: int, value: object) -> None:
        """A graph output was computed for the first time this step: use it, keep only what
        is returned later (forward outputs, input gradients)."""
        name = self.grad_position_to_param.get(position)
        if name is not None:
            _accumulate_grad(self.params[name], value)
            return
        name = self.buffer_of_position.get(position)
        if name is not None:
            self.buffers[name].copy_(value)
            return
        if position in self.kept_positions:
            step.results[position] = value


def _accumulate_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """What autograd's AccumulateGrad does: adopt (with the param's strides) or add in place."""
    if param.grad is None:
        if grad.stride() != param.stride() or grad.data_ptr() == param.data_ptr():
            grad = torch.empty_like(param).copy_(grad)
        param.grad = grad
    else:
        param.grad.add_(grad)


class RematFunction(torch.autograd.Function):
    """The step over ``(program, n_params, *params, *inputs)``: `forward` runs the program's
    forward part and returns the forward outputs; `backward` runs the rest with the output
    gradients and returns the input gradients (``None`` for the program, the count and the
    parameters, whose gradients the step put in ``.grad``)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, program: Program, n_params: int, *flat: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        first = program.first_step
        if first is not None:
            first.start()
        step = program.start(flat[:n_params], flat[n_params:])
        with no_autocast(program.captured.autocast.device_type):
            outputs = program.forward(step)
        if first is not None:
            first.end_forward()
        ctx.program, ctx.step, ctx.n_params = program, step, n_params
        tangent_outputs = set(program.captured.tangent_output_indices)
        ctx.mark_non_differentiable(*(o for k, o in enumerate(outputs) if k not in tangent_outputs))
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, not zeros
        return tuple(outputs)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, *grad_outputs: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        program: Program = ctx.program
        step: StepState = ctx.step
        ctx.step = None
        if step is None:
            raise BackwardError(
                "Rematerialized: backward ran twice through the same step; the schedule frees "
                "its values, so retain_graph=True is not supported"
            )
        first = program.first_step
        if first is not None:
            first.start()
        with torch.no_grad(), no_autocast(program.captured.autocast.device_type):
            tangents = program.tangents(grad_outputs)
            results = program.backward(step, tangents)
        if first is not None:
            first.end()
        needs_input_grad = ctx.needs_input_grad[2 + ctx.n_params :]
        input_grads: list[torch.Tensor | None] = [None] * len(needs_input_grad)
        for k, position in program.captured.input_grad_indices.items():
            if needs_input_grad[k]:
                input_grads[k] = results.get(position)
        return (None, None, *([None] * ctx.n_params), *input_grads)
