"""`capture`: trace a model's training step, measure it on real tensors (or estimate it for a
target device), group it for the solver."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn

from graph_capture.assemble import Grouping, assemble
from graph_capture.captured import CapturedGraph
from graph_capture.errors import CaptureError
from graph_capture.inputs import positional_inputs
from graph_capture.joint import trace_step
from graph_capture.measurement.calibrate import add_accumulation_seconds
from graph_capture.measurement.device import AutocastState, fork_rng, model_device, no_autocast
from graph_capture.measurement.estimate import estimate_joint, fake_step
from graph_capture.measurement.measure import SCRATCH_KEY, SECONDS_KEY, measure_joint
from graph_capture.measurement.peak import plain_step_peak
from graph_capture.measurement.roofline import resolve_target
from graph_capture.trace.zero_tangents import OutputName
from solver.core.budget import checkpoint_all_peak
from solver.core.graph import prepare
from solver.deadline import NEVER, Deadline, check_time_limit
from solver.errors import ArgumentError, DeadlineError
from solver.spelling import spelled
from solver.target import Device

GRANULARITIES = ("op", "module")


@spelled
def capture(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    *,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
    granularity: str = "op",
    cost_model: str = "time",
    module_depth: int | None = None,
    repeats: int = 5,
    backward_from: Sequence[OutputName] | None = None,
    plain_peak: bool = False,
    target: str | Device | None = None,
    time_limit: float | None = None,
) -> CapturedGraph:
    """Capture ``model(*example_inputs, **example_kwargs)`` forward + backward as a
    `CapturedGraph`.

    ``example_kwargs``: keyword tensor arguments, as models are often called
    (``labels=``, ``attention_mask=``); the graph's user inputs are the positional ones, then
    these in the given order (``kwarg_names``). Capture runs under the autocast state in force
    for the model's device and records it (``autocast``): the graph holds autocast's casts, so
    it replays eager only under that same state. Tangents and measurements are made on the
    model's device.

    ``granularity``: "op" (one DAG node per allocating aten op, views folded in) or "module"
    (consecutive ops of one module and phase merged; ``module_depth`` truncates module paths).
    ``cost_model``: "time" (DAG ``cost`` in seconds, each op's least over ``repeats - 1``
    passes over the graph in step order, `graph_capture.measurement.measure.measure_joint`; the
    graph attribute ``step_cost``, seconds, is the least of those passes' whole wall times plus the
    gradient accumulation: one plain step with what runs between ops) or "flops"; the graph
    attribute ``cost_model`` records it, and a measured graph's ``device`` the type of the
    device its seconds were measured on (``"cpu"``, ``"cuda"``: the host link a plan pairs
    with, docs/offload.md).
    ``backward_from``: the outputs the training step backpropagates from, by
    top-level name (``["loss"]`` for a HuggingFace ``ModelOutput``; a tuple's indices); the
    other outputs' incoming gradients are known zero and the graph is specialised for that
    (`graph_capture.trace.zero_tangents`: eager does not compute them, nor does the executor then).
    ``None``: every output that requires grad may get a gradient. Measurement runs the graph
    once on the example inputs with tangents of ones (zeros where known zero); the graph
    attribute ``plain_peak`` is the measured peak bytes of the plain eager step with those
    gradients (`graph_capture.measurement.peak.plain_step_peak`: 100% of a percentage budget),
    measured where ``plain_peak=True`` (one more eager step: `rematerialize` asks for it with a
    percentage budget, the CLI for every capture, so that a saved graph carries it).
    ``target`` (estimate mode; docs/estimate.md): a built-in device name (``"h100"``, ...),
    ``"cpu"``, a device file (``remat calibrate``) or a `solver.target.Device`. No real step
    runs: the model (built on the meta device, or real: its weights are never read) is traced
    on fake tensors, bytes come from the fake storages rounded as the target's allocator rounds,
    seconds from the target's model (`graph_capture.measurement.estimate`); ``plain_peak`` is
    predicted, the simulated peak of the schedule keeping everything (every node once, kernel
    workspaces included), and the graph attributes ``plain_peak_basis`` ("predicted"),
    ``target`` (the device's name) and ``step_cost`` (predicted seconds) say so.
    The global RNG state and the model are left as they were. ``example_inputs``: a tuple or
    list, or one tensor (`graph_capture.inputs.positional_inputs`). Raises `CaptureError`, and
    `solver.target.UnknownTargetError` for an unknown target.
    ``time_limit``: seconds for the whole call (None: no limit; one that is not a positive
    number is refused with the line every entry point gives, `solver.deadline.check_time_limit`).
    Its one `solver.Deadline` is checked before every step begins: the trace, each op of the
    measuring run, the scratch bytes' runs, each timed pass, the gradient accumulation, the
    plain step, the grouping (in estimate mode: the trace, each op, the grouping); past it,
    `CaptureError` saying which step it came before and what to do (raise ``time_limit``, or
    measure fewer ``repeats``).

    Two paths share the tracing (`graph_capture.joint.trace_step`) and the DAG's assembly
    (`graph_capture.assemble.assemble`):
    `_capture_measured` (no ``target``) and `_capture_estimated`.

    Exception to the 8-parameter rule: a public entry point whose keyword-only parameters are
    the one interface's options.
    """
    if granularity not in GRANULARITIES:
        raise ArgumentError(f"granularity must be one of {GRANULARITIES}, not {granularity!r}")
    if time_limit is not None:
        check_time_limit(time_limit, CaptureError)
    deadline = NEVER if time_limit is None else Deadline.after(time_limit)
    example_inputs = positional_inputs(example_inputs)
    kwargs = dict(example_kwargs or {})
    target_device = _target_device(target)
    grouping = Grouping(granularity, cost_model, module_depth)
    try:
        if target_device is None:
            return _capture_measured(
                model,
                example_inputs,
                kwargs,
                grouping,
                backward_from,
                repeats,
                plain_peak,
                deadline,
            )
        return _capture_estimated(
            model, example_inputs, kwargs, grouping, backward_from, target_device, deadline
        )
    except DeadlineError as passed:
        measured_passes = repeats if target_device is None else 1
        raise _past_time_limit(passed, time_limit, measured_passes) from passed


def _capture_measured(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    grouping: Grouping,
    backward_from: Sequence[OutputName] | None,
    repeats: int,
    measure_plain_peak: bool,
    deadline: Deadline,
) -> CapturedGraph:
    """`capture` on the model's device, in order, under a forked RNG, each step checking
    ``deadline`` before it begins (`DeadlineError`):

    1. `trace_step`: the joint graph on the real inputs, its tangents and arguments
    2. `measure_joint`: each op's seconds (least of ``repeats - 1`` passes) and bytes, run
       without autocast (the graph holds its casts); each op's seconds and scratch bytes kept
       in its node's meta (`remat calibrate`)
    3. `add_accumulation_seconds`: the gradient accumulation's seconds
    4. `_plain_peak` (where ``measure_plain_peak``): one eager step's measured peak bytes

    then `assemble`, with the graph attributes ``device`` (the type of the device the step ran
    on, ``"cpu"`` or ``"cuda"``: the device whose seconds the costs are), ``plain_peak`` (where
    measured) and ``step_cost`` (seconds, the least whole pass plus the accumulation; cost model
    "time").
    """
    device = model_device(model)
    autocast = AutocastState.current(device)
    with fork_rng(device):
        deadline.check("the trace")
        joint = trace_step(model, example_inputs, kwargs, backward_from, contextlib.nullcontext())
        gm = joint.gm
        with no_autocast(device.type):
            measured = measure_joint(gm, joint.args, repeats=repeats, deadline=deadline)
        for node in gm.graph.nodes:
            if node.name in measured.nodes:
                node.meta[SECONDS_KEY] = measured.nodes[node.name].seconds
                node.meta[SCRATCH_KEY] = measured.nodes[node.name].scratch_bytes
        deadline.check("timing the gradient accumulation")
        accumulation = add_accumulation_seconds(
            gm, joint.grad_positions, measured.outputs, measured.nodes, repeats
        )
        plain_peak = None
        if measure_plain_peak:
            deadline.check("the plain step's peak")
            plain_peak = _plain_peak(
                model, example_inputs, kwargs, joint.layout, joint.tangents, joint.zero_outputs
            )
    deadline.check("grouping the graph")
    captured = assemble(model, example_inputs, kwargs, joint, measured, grouping, None, autocast)
    captured.dag.graph["device"] = device.type
    if plain_peak is not None:
        captured.dag.graph["plain_peak"] = plain_peak
    if grouping.cost_model == "time" and measured.pass_seconds is not None:
        captured.dag.graph["step_cost"] = measured.pass_seconds + accumulation
    return captured


def _capture_estimated(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    grouping: Grouping,
    backward_from: Sequence[OutputName] | None,
    target: Device,
    deadline: Deadline,
) -> CapturedGraph:
    """`capture` for ``target`` with no real step, in order, under a forked RNG, each step
    checking ``deadline`` before it begins (`DeadlineError`):

    1. `fake_step`: the model's parameters and buffers and the inputs as fake CPU tensors
    2. `trace_step`: the joint graph on them, its tangents made in the fake mode
    3. `estimate_joint`: each op's predicted seconds and bytes (storages rounded as the
       target's allocator rounds)

    then `assemble`, with the graph attributes ``plain_peak`` (bytes, the simulated peak of
    keeping everything), ``plain_peak_basis`` ("predicted") and ``step_cost`` (seconds, the
    predicted ops' sum; cost model "time").
    """
    device = torch.device("cpu")
    autocast = AutocastState.current(device)
    deadline.check("the trace")
    with fork_rng(device), fake_step(model, example_inputs, kwargs) as fake:
        joint = trace_step(
            model, fake.inputs, fake.kwargs, backward_from, fake.mode, (example_inputs, kwargs)
        )
        measured = estimate_joint(
            joint.gm, joint.args, target, fake.mode, joint.grad_positions, deadline
        )
    deadline.check("grouping the graph")
    captured = assemble(model, example_inputs, kwargs, joint, measured, grouping, target, autocast)
    dag = captured.dag
    dag.graph["plain_peak"] = max(1, checkpoint_all_peak(prepare(dag)))
    dag.graph["plain_peak_basis"] = "predicted"
    if grouping.cost_model == "time" and measured.pass_seconds is not None:
        dag.graph["step_cost"] = measured.pass_seconds
    return captured


def _past_time_limit(passed: DeadlineError, time_limit: float, repeats: int) -> CaptureError:
    """The error of a capture that ran past ``time_limit`` seconds (``passed``: before which
    step), saying what to do: raise it, or measure fewer passes where ``repeats`` > 1."""
    fewer = (
        f", or measure fewer passes (repeats={repeats}: each beyond the first is one more timed "
        "run of the step)"
        if repeats > 1
        else ""
    )
    return CaptureError(
        f"capture ran past time_limit={time_limit:g} s ({passed}): raise time_limit{fewer}"
    )


def _target_device(target: str | Device | None) -> Device | None:
    """The target of an estimate (None: measured mode); `UnknownTargetError` for an unknown
    one."""
    return None if target is None else resolve_target(target)


def _plain_peak(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    layout: dict,
    tangents: Sequence[torch.Tensor],
    zero_outputs: Sequence[int],
) -> int | None:
    """Measured peak bytes of the eager step the graph stands for: the forward, then backward
    from the outputs the graph gives tangents (ones), known-zero ones left out. None where the
    model's outputs do not flatten to the graph's forward outputs."""
    given = [
        (k, t)
        for k, t in zip(layout["tangent_output_indices"], tangents, strict=True)
        if k not in zero_outputs
    ]

    def step() -> None:
        outputs = pytree.tree_leaves(model(*example_inputs, **kwargs))
        if len(outputs) != len(layout["forward_output_indices"]):
            raise _Unflattened
        torch.autograd.backward([outputs[k] for k, _ in given], [t for _, t in given])

    try:
        return plain_step_peak(model, step, model_device(model))
    except _Unflattened:
        return None


class _Unflattened(Exception):
    """The model's outputs do not flatten to the captured forward outputs."""
