"""`Rematerialized`: a model wrapped to train under a solved rematerialization schedule.

One training step is one `torch.autograd.Function`:

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

import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import networkx as nx
import torch
import torch.utils._pytree as pytree
from torch import nn

from executor.check import CheckReport, NamedValues, check_step
from executor.errors import (
    RematerializeError,
    UnsupportedScheduleError,
    UnusedOutputGradientError,
)
from executor.traced.checks import check_call
from executor.traced.codegen import SliceState, compile_ops
from executor.traced.estimated import EstimateCheck, FirstStepPeak, match_estimated
from executor.traced.interpreter import ScheduleInterpreter, Step
from executor.traced.offload import HostPool, Transfers
from graph_capture.captured import CapturedGraph
from graph_capture.inputs import positional_inputs
from graph_capture.measurement.device import no_autocast
from graph_capture.trace.zero_tangents import output_leaves
from solver.core.budget import PERCENT, Budget
from solver.core.link import Link
from solver.core.schedule import Schedule
from solver.core.simulate import simulate
from solver.deadline import Deadline
from solver.errors import ScheduleMismatchError, SolverTimeoutError
from solver.interrupt import call_deadline
from solver.target.devices import host_link

__all__ = [
    "Rematerialized",
    "check_against_eager",
    "load_schedule",
    "rematerialize",
    "split_ops",
]

Op = tuple[str, Hashable]


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


class _Program:
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

    def start(self, params: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Step:
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

    def forward(self, step: Step) -> list[torch.Tensor]:
        """Run the forward part; returns the forward outputs. Leaves the RNG where eager would."""
        self.run_forward(step)
        step.rng.finish()
        return [step.results.pop(i) for i in self.captured.forward_output_indices]

    def backward(self, step: Step, tangents: Sequence[torch.Tensor]) -> dict[int, object]:
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

    def _record_placeholder_results(self, step: Step) -> None:
        for position, slot in self.placeholder_results:
            if position not in step.seen and step.env[slot] is not None:
                step.seen.add(position)
                self._on_result(step, position, step.env[slot])

    def _on_result(self, step: Step, position: int, value: object) -> None:
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


class _RematFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, program: _Program, n_params: int, *flat: torch.Tensor):  # type: ignore[override]
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
    def backward(ctx, *grad_outputs: torch.Tensor):  # type: ignore[override]
        program: _Program = ctx.program
        step: Step = ctx.step
        ctx.step = None
        if step is None:
            raise RuntimeError(
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


class Rematerialized(nn.Module):
    """`model` trained under `schedule`: same outputs, bit-identical gradients, less memory.

    Use it like the model: ``out = rm(*inputs, **kwargs); loss(out).backward();
    optimizer.step()``. Parameters are the model's own (``rm.parameters()`` yields them), so an
    optimizer built on either works, and so does ``DistributedDataParallel(rm)``. Inputs must
    match the captured example in count, keyword names, shape, dtype and device, and a step
    must run under the autocast state the graph was captured under.
    A schedule solved in estimate mode (``schedule.extra["target"]``) is matched to ``captured``
    by structure (`executor.traced.estimated`), and its first step measures its peak:
    `estimate_check` and an `EstimatedPeakWarning` report it against the predicted one.
    In eval mode (``rm.eval()``) it calls the model directly: the schedule is for training.
    ``compiled=True`` runs the schedule as generated straight-line code (`executor.traced.codegen`);
    ``compiled=False`` walks it with `ScheduleInterpreter` (same results, slower, debuggable).
    """

    def __init__(
        self,
        model: nn.Module,
        captured: CapturedGraph,
        schedule: Schedule,
        *,
        compiled: bool = True,
    ) -> None:
        super().__init__()
        if _estimated_for_another(schedule, captured):
            schedule = match_estimated(schedule, captured.dag, "given")
        schedule.check_graph(captured.dag)
        simulate(captured.dag, schedule.ops, schedule.link).raise_if_invalid()
        self.model = model
        self.captured = captured
        self.schedule = schedule
        self._program = _Program(model, captured, schedule, compiled)
        self._check: CheckReport | None = None

    def save(self, path: str | Path) -> None:
        """Write the schedule (`solver.Schedule.save`: its ops, claims and the fingerprint of
        the graph it belongs to), what `load` reads back for this model."""
        self.schedule.save(path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        model: nn.Module,
        example_inputs: Sequence[torch.Tensor] | torch.Tensor,
        example_kwargs: Mapping[str, torch.Tensor] | None = None,
        *,
        capture_options: Mapping[str, object] | None = None,
    ) -> Rematerialized:
        """Capture `model` on the example inputs and load the schedule at `path` (`save`, or
        solved offline: `remat solve --out`; `load_schedule`). `capture_options` go to
        `graph_capture.capture` and must be those the schedule's graph was captured with
        (``backward_from``, ``granularity``, ...), as must torch's thread count.

        Raises solver.errors.ScheduleMismatchError (one line) when the file was solved for
        another graph: another model, other inputs or other capture options. Like
        `rematerialize`, it returns only a module whose step on the example inputs matched
        eager's bit for bit (`check_against_eager`: `RematerializeError` otherwise).
        """
        from graph_capture import capture

        captured = capture(model, example_inputs, example_kwargs, **(capture_options or {}))
        loaded = cls(model, captured, load_schedule(path, captured.dag))
        check_against_eager(loaded, example_inputs, example_kwargs)
        return loaded

    @classmethod
    def from_file(cls, *_args: object, **_kwargs: object) -> NoReturn:
        """Refused: loading is `Rematerialized.load(path, model, example_inputs, ...)`."""
        raise TypeError(
            "Rematerialized.from_file is not the spelling: use Rematerialized.load(path, "
            "model, example_inputs, example_kwargs=None, *, capture_options=None)"
        )

    @property
    def check(self) -> CheckReport | None:
        """The step held against eager's before this module was handed over
        (`check_against_eager`: `rematerialize` and `load` make it); None where none ran (the
        module built directly from a capture, or a capture in estimate mode)."""
        return self._check

    @property
    def estimate_check(self) -> EstimateCheck | None:
        """For a schedule solved in estimate mode, its first step's measured peak against the
        predicted one, once that step's backward has run; else None."""
        first = self._program.first_step
        return None if first is None else first.check

    @property
    def predicted_peak_bytes(self) -> int:
        """The schedule's peak (`solver.simulate`): live values plus the transient bytes of the
        op running. With capture's transients (each op's measured workspace and the bytes this
        executor holds beside the values) it is what the step measures above its start, with
        ``.grad`` allocated before the step (docs/executor.md, "The byte budget")."""
        return self.schedule.peak

    @property
    def host_pool(self) -> HostPool | None:
        """The host memory the schedule's offloaded copies occupy (`HostPool`: bytes held now
        and at peak, over every step so far, `reset_peak` to start again); None for a schedule
        without a link. A step's host peak is the schedule's predicted one
        (``schedule.extra["host_peak"]``, `solver.simulate`'s ``host_peak``)."""
        transfers = self._program.transfers
        return None if transfers is None else transfers.pool

    def forward(self, *inputs: torch.Tensor, **kwargs: torch.Tensor) -> object:
        if not self.training:
            return self.model(*inputs, **kwargs)
        check_call(self.captured, self._program.params[0].device, inputs, kwargs)
        flat = self.captured.flat_inputs(inputs, kwargs)
        params = self._program.params
        outputs = _RematFunction.apply(self._program, len(params), *params, *flat)
        return pytree.tree_unflatten(list(outputs), self.captured.output_treespec)


def load_schedule(path: str | Path, dag: nx.DiGraph) -> Schedule:
    """The schedule file at `path`, checked against the captured `dag` (`Schedule.load`). Where
    it belongs to another graph and the two captures ran with different torch thread counts
    (graph attribute ``threads``, `extra["threads"]` of the schedule), the error says so: an
    op's workspace bytes depend on that count. A schedule solved in estimate mode is matched
    by structure (`executor.traced.estimated.match_estimated`)."""
    schedule = Schedule.load(path)
    if _estimated_for_another(schedule, dag):
        return match_estimated(schedule, dag, path)
    try:
        return Schedule.load(path, dag)
    except ScheduleMismatchError as error:
        solved, here = Schedule.load(path).extra.get("threads"), dag.graph.get("threads")
        if solved is None or here is None or solved == here:
            raise
        raise ScheduleMismatchError(
            f"{error} The schedule was solved on a capture with {solved} thread(s) and this "
            f"capture ran with {here}: an op's workspace bytes depend on the thread count, so "
            f"capture with {solved} (torch.set_num_threads, or remat run --threads {solved})."
        ) from error


def _estimated_for_another(schedule: Schedule, captured: CapturedGraph | nx.DiGraph) -> bool:
    """A schedule solved in estimate mode, not yet matched to ``captured``, a measured one."""
    dag = captured.dag if isinstance(captured, CapturedGraph) else captured
    extra = schedule.extra
    return "target" in extra and "estimated_peak" not in extra and "target" not in dag.graph


def rematerialize(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    budget: int | float | str,
    *,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
    time_limit: float = 60.0,
    capture_options: Mapping[str, object] | None = None,
    offload: Link | str | None = None,
    **solve_options: object,
) -> Rematerialized:
    """Capture `model`, solve for `budget` and wrap: the one call for the common case.

    `budget` (`solver.core.budget.Budget`): bytes, "512MiB", "50%" of the measured peak of the
    plain training step (capture measures it for a percentage: graph attribute
    ``plain_peak``), or "min" (the least peak, then the least cost at it). The model is
    captured as called with ``model(*example_inputs, **example_kwargs)`` (`example_inputs`: a
    tuple or list, or one tensor), under the autocast state in force (train under the same
    one); the wrapped model returns the model's outputs, the loss is the caller's.
    `time_limit`: seconds for the whole call, capture and solve: the solve gets what the
    capture leaves (`solver.solve`'s bound); `RematerializeError` where it is not a positive
    number of seconds. `capture_options` go to `graph_capture.capture` (``granularity``,
    ``cost_model``, ...), `solve_options` to `solver.solve` (``workers``, ...). `offload`: a
    host link (`solver.Link`, bytes per second each way on a captured graph, whose costs are
    seconds), or the name of one (``"pcie5"``, `solver.target.devices.HOST_LINKS`) or of a
    built-in target (``"h100"``, its link): values may also be offloaded to host memory and
    reloaded (docs/offload.md), the step runs the copies (`Rematerialized.host_pool`); a
    budget in bytes or percent. Ctrl-C (from
    the main thread, where SIGINT has Python's default handler): the first ends the call as
    the time limit does (the capture runs to its end, then the solve returns the best
    schedule it has), a second raises KeyboardInterrupt.
    """
    import solver
    from graph_capture import capture

    wanted = Budget.of(budget)  # an unreadable budget fails before the capture
    link = _link(offload)
    options = {"plain_peak": wanted.kind == PERCENT, **(capture_options or {})}
    with call_deadline(time_limit, RematerializeError) as deadline:
        captured = capture(model, example_inputs, example_kwargs, **options)
        if deadline.passed() and not deadline.stopped():
            took = time.perf_counter() - (deadline.at - time_limit)
            raise SolverTimeoutError(
                f"the capture took all of time_limit={time_limit:g} s ({took:.1f} s): raise "
                "time_limit to leave the solve some"
            )
        schedule = solver.solve(
            captured.dag,
            wanted,
            time_limit=time_limit,
            deadline=_leave_for_check(deadline, captured),
            offload=link,
            **solve_options,
        )
    remat = Rematerialized(model, captured, schedule)
    check_against_eager(remat, example_inputs, example_kwargs)
    return remat


def _leave_for_check(deadline: Deadline, captured: CapturedGraph) -> Deadline:
    """The solve's deadline: ``deadline`` less what the check after it takes (one eager and
    one rematerialized step: three times the plain step's seconds measured at capture, graph
    attribute ``step_cost``), but never less than half the time left."""
    check_seconds = 3.0 * float(captured.dag.graph.get("step_cost", 0.0))
    half = time.perf_counter() + deadline.remaining() / 2
    return deadline.until(max(half, deadline.at - check_seconds))


def check_against_eager(
    remat: Rematerialized,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
) -> CheckReport | None:
    """Hold one step of ``remat`` on the example inputs against one eager step of its model
    from the same state (`executor.check.check_step`), bit for bit: every output, every
    input's and parameter's ``.grad``, every buffer. The step backpropagates what the capture
    did (`CapturedGraph.default_tangents`: ones into each differentiable output, zeros into
    those ``backward_from`` leaves out). The model's buffers, ``.grad`` and generator states
    are left as found; the report is ``remat.check``. A capture in estimate mode (graph
    attribute ``target``: fake tensors, nothing to run) is not checked: None.

    Cost: one eager and one rematerialized step (docs/executor.md, "The check before
    handing over"). Raises `RematerializeError` naming the first value that differs and its
    relative difference."""
    captured = remat.captured
    if "target" in captured.dag.graph:
        return None
    inputs = positional_inputs(example_inputs, RematerializeError)
    kwargs = dict(example_kwargs or {})
    program = remat._program
    first_step, program.first_step = program.first_step, None  # the user's first step measures
    try:
        remat._check = check_step(
            remat.model,
            _tangent_step(remat, captured, inputs, kwargs),
            _tangent_step(remat.model, captured, inputs, kwargs),
            subject="the rematerialized step",
            reference_name="eager's on the example inputs",
            error=RematerializeError,
            advice=(
                "the traced graph computes another way than eager here (e.g. an HF model whose "
                "eager code reads input values to choose its attention kernel, "
                "docs/training.md); train this model without remat, and report it with the model"
            ),
        )
    finally:
        program.first_step = first_step
    return remat._check


def _tangent_step(
    call: nn.Module,
    captured: CapturedGraph,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
) -> Callable[[], NamedValues]:
    """One step through ``call`` on fresh leaves of the inputs, backward from the capture's
    default tangents; returns every tensor output ("output NAME") and every input gradient
    ("grad of input NAME")."""
    names = {k: name for name, ks in output_leaves(captured.output_treespec).items() for k in ks}

    def leaf(x: object) -> object:
        return x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    def step() -> NamedValues:
        args = [leaf(x) for x in inputs]
        keywords = {k: leaf(v) for k, v in kwargs.items()}
        flat, _ = pytree.tree_flatten(call(*args, **keywords))
        diff = [flat[i] for i in captured.tangent_output_indices]
        torch.autograd.backward(diff, captured.default_tangents())
        values = [
            (f"output {names.get(k, k)!r} (flat output {k})", x.detach().clone())
            for k, x in enumerate(flat)
            if isinstance(x, torch.Tensor)
        ]
        leaves = [*enumerate(args), *keywords.items()]
        values += [
            (f"grad of input {k!r}", x.grad)
            for k, x in leaves
            if isinstance(x, torch.Tensor) and x.grad is not None
        ]
        return values

    return step


def _link(offload: Link | str | None) -> Link | None:
    """The host link `rematerialize`'s ``offload`` names; RematerializeError for what is none."""
    if offload is None:
        return None
    if isinstance(offload, Link | str):
        return host_link(offload)
    raise RematerializeError(
        f"offload must be a solver.Link, the name of a host link or target ('pcie5', 'h100'), "
        f"or None, not {offload!r}"
    )
