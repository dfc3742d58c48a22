"""`capture`: trace a model's training step, measure it on real tensors (or estimate it for a
target device), group it for the solver."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import nn

from graph_capture.captured import CapturedGraph, TensorSpec
from graph_capture.dag import build_dag, structure_fingerprint
from graph_capture.errors import CaptureError
from graph_capture.grouping import group_modules, group_ops, op_group_order
from graph_capture.inputs import positional_inputs
from graph_capture.measurement.calibrate import add_accumulation_seconds
from graph_capture.measurement.device import (
    AutocastState,
    fork_rng,
    generator,
    model_device,
    no_autocast,
)
from graph_capture.measurement.estimate import (
    CUDA_GENERATOR_STATE_BYTES,
    estimate_joint,
    fake_step,
)
from graph_capture.measurement.measure import (
    SCRATCH_KEY,
    SECONDS_KEY,
    JointMeasure,
    StorageKey,
    is_random,
    measure_joint,
    storages_of,
)
from graph_capture.measurement.peak import plain_step_peak
from graph_capture.measurement.roofline import resolve_target
from graph_capture.trace.fx_nodes import device_of
from graph_capture.trace.lifted import lifted_constants
from graph_capture.trace.trace import TracedJoint, trace_joint
from graph_capture.trace.zero_tangents import (
    OutputName,
    default_tangents,
    fold_zero_tangent_adds,
    selected_outputs,
)
from solver.core.budget import checkpoint_all_peak
from solver.core.graph import prepare
from solver.target import Device

GRANULARITIES = ("op", "module")


def capture(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
    *,
    granularity: str = "op",
    cost_model: str = "time",
    module_depth: int | None = None,
    repeats: int = 5,
    backward_from: Sequence[OutputName] | None = None,
    plain_peak: bool = False,
    target: str | Device | None = None,
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
    gradient accumulation: one plain step with what runs between ops) or "flops".
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

    Two paths share the tracing (`_trace`) and the DAG's assembly (`_assemble`):
    `_capture_measured` (no ``target``) and `_capture_estimated`.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, not {granularity!r}")
    example_inputs = positional_inputs(example_inputs)
    kwargs = dict(example_kwargs or {})
    target_device = _target_device(target)
    grouping = _Grouping(granularity, cost_model, module_depth)
    if target_device is None:
        return _capture_measured(
            model, example_inputs, kwargs, grouping, backward_from, repeats, plain_peak
        )
    return _capture_estimated(model, example_inputs, kwargs, grouping, backward_from, target_device)


@dataclass(frozen=True)
class _Grouping:
    """How the DAG is made from the joint graph: `capture`'s ``granularity``, ``cost_model``
    and ``module_depth``."""

    granularity: str
    cost_model: str
    module_depth: int | None


@dataclass(frozen=True)
class _Joint:
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


def _capture_measured(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    grouping: _Grouping,
    backward_from: Sequence[OutputName] | None,
    repeats: int,
    measure_plain_peak: bool,
) -> CapturedGraph:
    """`capture` on the model's device, in order, under a forked RNG:

    1. `_trace`: the joint graph on the real inputs, its tangents and arguments
    2. `measure_joint`: each op's seconds (least of ``repeats - 1`` passes) and bytes, run
       without autocast (the graph holds its casts); each op's seconds and scratch bytes kept
       in its node's meta (`remat calibrate`)
    3. `add_accumulation_seconds`: the gradient accumulation's seconds
    4. `_plain_peak` (where ``measure_plain_peak``): one eager step's measured peak bytes

    then `_assemble`, with the graph attributes ``plain_peak`` (where measured) and
    ``step_cost`` (seconds, the least whole pass plus the accumulation; cost model "time").
    """
    device = model_device(model)
    autocast = AutocastState.current(device)
    with fork_rng(device):
        joint = _trace(model, example_inputs, kwargs, backward_from, contextlib.nullcontext())
        gm = joint.gm
        with no_autocast(device.type):
            measured = measure_joint(gm, joint.args, repeats=repeats)
        for node in gm.graph.nodes:
            if node.name in measured.nodes:
                node.meta[SECONDS_KEY] = measured.nodes[node.name].seconds
                node.meta[SCRATCH_KEY] = measured.nodes[node.name].scratch_bytes
        accumulation = add_accumulation_seconds(
            gm, joint.grad_positions, measured.outputs, measured.nodes, repeats
        )
        plain_peak = (
            _plain_peak(
                model, example_inputs, kwargs, joint.layout, joint.tangents, joint.zero_outputs
            )
            if measure_plain_peak
            else None
        )
    captured = _assemble(model, example_inputs, kwargs, joint, measured, grouping, None, autocast)
    if plain_peak is not None:
        captured.dag.graph["plain_peak"] = plain_peak
    if grouping.cost_model == "time" and measured.pass_seconds is not None:
        captured.dag.graph["step_cost"] = measured.pass_seconds + accumulation
    return captured


def _capture_estimated(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    grouping: _Grouping,
    backward_from: Sequence[OutputName] | None,
    target: Device,
) -> CapturedGraph:
    """`capture` for ``target`` with no real step, in order, under a forked RNG:

    1. `fake_step`: the model's parameters and buffers and the inputs as fake CPU tensors
    2. `_trace`: the joint graph on them, its tangents made in the fake mode
    3. `estimate_joint`: each op's predicted seconds and bytes (storages rounded as the
       target's allocator rounds)

    then `_assemble`, with the graph attributes ``plain_peak`` (bytes, the simulated peak of
    keeping everything), ``plain_peak_basis`` ("predicted") and ``step_cost`` (seconds, the
    predicted ops' sum; cost model "time").
    """
    device = torch.device("cpu")
    autocast = AutocastState.current(device)
    with fork_rng(device), fake_step(model, example_inputs, kwargs) as fake:
        joint = _trace(
            model, fake.inputs, fake.kwargs, backward_from, fake.mode, (example_inputs, kwargs)
        )
        measured = estimate_joint(joint.gm, joint.args, target, fake.mode, joint.grad_positions)
    captured = _assemble(model, example_inputs, kwargs, joint, measured, grouping, target, autocast)
    dag = captured.dag
    dag.graph["plain_peak"] = max(1, checkpoint_all_peak(prepare(dag)))
    dag.graph["plain_peak_basis"] = "predicted"
    if grouping.cost_model == "time" and measured.pass_seconds is not None:
        dag.graph["step_cost"] = measured.pass_seconds
    return captured


def _trace(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    backward_from: Sequence[OutputName] | None,
    tensor_mode: contextlib.AbstractContextManager,
    values: tuple[Sequence[torch.Tensor], Mapping[str, torch.Tensor]] | None = None,
) -> _Joint:
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
    return _Joint(traced, layout, output_specs, zero_outputs, tangents, args)


def _assemble(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    joint: _Joint,
    measured: JointMeasure,
    grouping: _Grouping,
    target: Device | None,
    autocast: AutocastState,
) -> CapturedGraph:
    """The `CapturedGraph` of a traced and measured (or estimated: ``target``) joint graph:
    its ops grouped (`group_ops`; by module at granularity "module"), the static and held bytes
    (`_static_bytes`, `_held_bytes`; rounded as ``target``'s allocator rounds), the DAG
    (`build_dag`) and its graph attributes ``structure``, ``target`` (estimate mode),
    ``held_bytes``, ``static_bytes``, ``granularity``, ``threads`` and ``name``."""
    gm, layout = joint.gm, joint.layout
    group = group_ops(gm, measured.nodes)
    order = op_group_order(gm, group)
    modules = None
    if grouping.granularity == "module":
        group, order, modules = group_modules(gm, group, order, grouping.module_depth)
    rounding = 1 if target is None else target.rounding
    static = _static_bytes(joint.args, layout, measured.outputs, lifted_constants(gm), rounding)
    held = _held_bytes(
        gm, layout, joint.args, measured.outputs, static, _state_bytes(target), rounding
    )
    dag, members = build_dag(
        gm, measured.nodes, group, order, grouping.cost_model, modules, sum(held.values())
    )
    dag.graph["structure"] = structure_fingerprint(dag)
    if target is not None:
        dag.graph["target"] = target.name
    dag.graph["held_bytes"] = held
    dag.graph["static_bytes"] = static
    dag.graph["granularity"] = grouping.granularity
    dag.graph["threads"] = torch.get_num_threads()
    dag.graph["name"] = f"{type(model).__name__} ({grouping.granularity})"
    return CapturedGraph(
        joint=gm,
        dag=dag,
        members=members,
        granularity=grouping.granularity,
        cost_model=grouping.cost_model,
        random_nodes=[n.name for n in gm.graph.nodes if n.op == "call_function" and is_random(n)],
        static_bytes=static,
        input_specs=[TensorSpec.of(x) for x in [*example_inputs, *kwargs.values()]],
        kwarg_names=tuple(kwargs),
        autocast=autocast,
        output_specs=joint.output_specs,
        output_treespec=joint.traced.output_treespec,
        node_group=group,
        zero_tangent_outputs=tuple(joint.zero_outputs),
        mask_guards=joint.traced.mask_guards,
        **{k: v for k, v in layout.items() if k != "grad_indices"},
    )


def _target_device(target: str | Device | None) -> Device | None:
    """The target of an estimate (None: measured mode); `UnknownTargetError` for an unknown
    one."""
    return None if target is None else resolve_target(target)


def _state_bytes(target: Device | None) -> Callable[[torch.fx.Node], int]:
    """Bytes of the saved generator state of a random node: its device's, measured; in
    estimate mode the CPU's for target ``cpu``, else a CUDA generator's."""
    if target is None:
        return _generator_state_bytes
    if target.name == "cpu":
        cpu = torch.default_generator.get_state().nbytes
        return lambda _node: cpu
    return lambda _node: CUDA_GENERATOR_STATE_BYTES


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


def _held_bytes(
    gm: torch.fx.GraphModule,
    layout: dict,
    args: list[torch.Tensor],
    outputs: list[object],
    static: dict[str, int],
    state_bytes: Callable[[torch.fx.Node], int],
    rounding: int,
) -> dict[str, int]:
    """Bytes a training step under `executor.Rematerialized` holds besides the DAG's values,
    by part (each at most this much, at any moment of the step):

    - ``rng_states``: one saved generator state per random node (to replay its draw), and one
      more: the live state, put aside while a recompute replays a draw;
    - ``buffer_snapshots``: a copy of each buffer the step mutates (what recomputes read);
    - ``outputs``: the forward outputs, which the caller holds until the step ends;
    - ``tangents``: the incoming output gradients (autograd creates them for the backward);
    - ``input_grads``: gradients of inputs, held until they are handed back to autograd.

    Capture adds their sum to every node's ``transient``, so a schedule's peak counts them.
    ``state_bytes``: a random node's saved generator state; ``rounding``: the allocator's block.
    """
    random = [n for n in gm.graph.nodes if n.op == "call_function" and is_random(n)]
    buffers = dict(zip(layout["buffer_names"], args[len(layout["param_names"]) :], strict=False))
    mutated = storages_of([buffers[name] for name in layout["buffer_update_indices"]], rounding)
    forward = storages_of([outputs[i] for i in layout["forward_output_indices"]], rounding)
    input_grads = storages_of([outputs[i] for i in layout["input_grad_indices"].values()], rounding)
    return {
        "rng_states": sum(state_bytes(n) for n in random[:1] + random),
        "buffer_snapshots": sum(mutated.values()),
        "outputs": sum(forward.values()),
        "tangents": static["tangents"],
        "input_grads": sum(input_grads.values()),
    }


def _generator_state_bytes(node: torch.fx.Node) -> int:
    """Bytes of the saved state of the generator a random node draws from (its device's)."""
    return generator(device_of(node)).get_state().nbytes


def _static_bytes(
    args: list[torch.Tensor],
    layout: dict,
    outputs: list[object],
    constants: list[torch.Tensor],
    rounding: int,
) -> dict[str, int]:
    """Bytes of params, buffers, inputs, tangents, lifted constants (storage-deduplicated) and
    of the grads, each storage rounded up to a multiple of ``rounding``."""
    args = [*args, *constants]
    counts = [
        ("params", len(layout["param_names"])),
        ("buffers", len(layout["buffer_names"])),
        ("inputs", len(layout["input_placeholders"])),
        ("tangents", len(layout["tangent_placeholders"])),
        ("constants", len(constants)),
    ]
    seen: set[StorageKey] = set()
    static: dict[str, int] = {}
    start = 0
    for name, count in counts:
        storages = storages_of(args[start : start + count], rounding)
        static[name] = sum(b for k, b in storages.items() if k not in seen)
        seen.update(storages)
        start += count
    grad_positions = [
        *layout["param_grad_indices"].values(),
        *layout["input_grad_indices"].values(),
    ]
    grads = storages_of([outputs[i] for i in grad_positions], rounding)
    static["grads"] = sum(grads.values())
    return static


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
