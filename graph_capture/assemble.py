"""`assemble`: the `CapturedGraph` of a traced and measured (or estimated) joint graph: its ops
grouped into the DAG's nodes, and the bytes a step holds besides them (static and held)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from graph_capture.captured import CapturedGraph
from graph_capture.dag import build_dag, structure_fingerprint
from graph_capture.grouping import group_modules, group_ops, op_group_order
from graph_capture.joint import Joint
from graph_capture.measurement.device import AutocastState, generator
from graph_capture.measurement.estimate import CUDA_GENERATOR_STATE_BYTES
from graph_capture.measurement.measure import JointMeasure, StorageKey, is_random, storages_of
from graph_capture.tensor_spec import TensorSpec
from graph_capture.trace.fx_nodes import device_of
from graph_capture.trace.lifted import lifted_constants
from solver.target import Device


@dataclass(frozen=True)
class Grouping:
    """How the DAG is made from the joint graph: `capture`'s ``granularity``, ``cost_model``
    and ``module_depth``."""

    granularity: str
    cost_model: str
    module_depth: int | None


def assemble(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    joint: Joint,
    measured: JointMeasure,
    grouping: Grouping,
    target: Device | None,
    autocast: AutocastState,
) -> CapturedGraph:
    """The `CapturedGraph` of a traced and measured (or estimated: ``target``) joint graph:
    its ops grouped (`group_ops`; by module at granularity "module"), the static and held bytes
    (`_static_bytes`, `_held_bytes`; rounded as ``target``'s allocator rounds), the DAG
    (`build_dag`) and its graph attributes ``structure``, ``target`` (estimate mode),
    ``held_bytes``, ``static_bytes``, ``granularity``, ``cost_model`` ("time": node costs in
    seconds; "flops"), ``threads`` and ``name``."""
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
    dag.graph["cost_model"] = grouping.cost_model
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


def _state_bytes(target: Device | None) -> Callable[[torch.fx.Node], int]:
    """Bytes of the saved generator state of a random node: its device's, measured; in
    estimate mode the CPU's for target ``cpu``, else a CUDA generator's."""
    if target is None:
        return _generator_state_bytes
    if target.name == "cpu":
        cpu = torch.default_generator.get_state().nbytes
        return lambda _node: cpu
    return lambda _node: CUDA_GENERATOR_STATE_BYTES


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
