"""The solver's DAG from the joint graph AOTAutograd hands a partitioner.

The joint graph's nodes carry fake tensors (``meta["val"]``), not real ones, so each node's
bytes are its fake outputs' storages (views share their base's storage: an op's ``mem`` is the
storage it creates) and its seconds the roofline prediction on this processor
(`graph_capture.measurement.roofline`). Grouping and DAG attributes are capture's
(`graph_capture.grouping.group_ops`, `graph_capture.dag.build_dag`): one DAG node per op that
allocates, views folded into their base's node.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import networkx as nx
import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef

from executor.errors import CompileError
from graph_capture.dag import build_dag
from graph_capture.errors import CaptureError
from graph_capture.grouping import group_ops, op_group_order
from graph_capture.measurement.measure import NodeMeasure, is_random
from graph_capture.measurement.roofline import cpu_device, op_flops, op_seconds
from graph_capture.trace.fx_nodes import describe_op, phase_of

__all__ = [
    "END",
    "JointDag",
    "fuse_groups",
    "inline_reads",
    "joint_dag",
    "runs_once",
    "tangent_bytes",
]

END = "__step_end__"
"""The DAG's last node: it reads every graph output (the forward's outputs, the gradients),
which the compiled graphs hand back only at their end, so each stays live from its compute to
the end of the step."""


@dataclass
class JointDag:
    """``dag``: the solver's graph (attributes of `graph_capture.dag.build_dag`; random nodes
    flagged ``once``); ``members``: DAG node -> its fx node names in graph order;
    ``inlined``: backward DAG node -> fx nodes of the forward it computes again inside its own
    kernel, in graph order (`inline_reads`), each compute of it making its own copies."""

    dag: nx.DiGraph
    members: dict[str, list[str]]
    inlined: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def _tensors(value: object) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _storages(value: object) -> dict[tuple[int, int], int]:
    found: dict[tuple[int, int], int] = {}
    for tensor in _tensors(value):
        storage = tensor.untyped_storage()
        found[(StorageWeakRef(storage).cdata, 0)] = int(storage.nbytes())
    return found


def _check_static(node: torch.fx.Node) -> None:
    """Refuse symbolic sizes (dynamic or data-dependent shapes): bytes must be numbers."""
    for tensor in _tensors(node.meta.get("val")):
        if any(not isinstance(s, int) for s in tensor.shape):
            raise CompileError(
                f"{describe_op(node)} has a symbolic shape {tuple(tensor.shape)} (dynamic or "
                "data-dependent): remat budgets static shapes only; compile with "
                "dynamic=False and keep shapes independent of tensor values"
            )
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise CompileError(
            f"{describe_op(node)} yields a symbolic scalar (a data-dependent value): remat "
            "budgets static graphs only; keep Python control flow off tensor values"
        )


def _view_storages(
    node: torch.fx.Node, storages_of: dict[str, dict[tuple[int, int], int]]
) -> dict[tuple[int, int], int] | None:
    """The storage of a view op's base (``self``), or None for any other node. Inductor's
    joint passes replace nodes with new fake values but leave their views' values viewing the
    replaced value's storage, so a view's storage is taken from its base, not its own value."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    base = node.args[0] if node.args else None
    if not target.is_view or not isinstance(base, torch.fx.Node):
        return None
    return storages_of.get(base.name) or None


def _measures(gm: torch.fx.GraphModule) -> dict[str, NodeMeasure]:
    """Per computing fx node: storages and new storages of its fake outputs, predicted
    seconds and FLOPs (no scratch bytes: fake tensors allocate nothing)."""
    device = cpu_device()
    seen: set[tuple[int, int]] = set()
    measures: dict[str, NodeMeasure] = {}
    storages_of: dict[str, dict[tuple[int, int], int]] = {}
    for node in gm.graph.nodes:
        _check_static(node)
        storages = _view_storages(node, storages_of) or _storages(node.meta.get("val"))
        storages_of[node.name] = storages
        if node.op != "call_function":
            seen |= set(storages)
            continue
        new = set(storages) - seen
        seen |= new
        seconds, flops = 0.0, 0
        if isinstance(node.target, torch._ops.OpOverload):
            args, kwargs = pytree.tree_map_only(
                torch.fx.Node, lambda n: n.meta.get("val"), (node.args, node.kwargs)
            )
            out = node.meta.get("val")
            seconds = op_seconds(device, node.target, args, kwargs, out)
            flops = op_flops(node.target, args, kwargs, out)
        tensors = _tensors(node.meta.get("val"))
        measures[node.name] = NodeMeasure(
            storages=storages,
            new_storages=new,
            seconds=float(seconds),
            flops_counted=int(flops),
            flops=int(flops),
            shapes=[tuple(t.shape) for t in tensors],
            dtypes=[str(t.dtype)[6:] for t in tensors],
        )
    return measures


def _tag_backward(gm: torch.fx.GraphModule) -> None:
    """Tag as backward every untagged node that reads a tangent, directly or through others
    (nodes a joint pass inserted carry no tag), so phases follow the data."""
    backward: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if "tangents" in str(node.target):
                backward.add(node.name)
            continue
        if phase_of(node) == "backward":
            backward.add(node.name)
        elif any(a.name in backward for a in node.all_input_nodes):
            backward.add(node.name)
            if "partitioner_tag" not in node.meta:
                node.meta["partitioner_tag"] = "is_backward"


def _mutates(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def runs_once(node: torch.fx.Node) -> bool:
    """True for an op whose recompute differs from its first run: it draws or mutates."""
    return is_random(node) or _mutates(node)


def tangent_bytes(gm: torch.fx.GraphModule) -> int:
    """Bytes of the incoming output gradients: allocated before the backward graph runs."""
    return sum(
        sum(_storages(n.meta.get("val")).values())
        for n in gm.graph.find_nodes(op="placeholder")
        if "tangents" in str(n.target)
    )


_REDUCTIONS = {
    torch.ops.aten.sum.dim_IntList,
    torch.ops.aten.sum.default,
    torch.ops.aten.amax.default,
    torch.ops.aten.amin.default,
    torch.ops.aten.mean.dim,
    torch.ops.aten.mean.default,
    torch.ops.aten.var_mean.correction,
    torch.ops.aten.any.dim,
}
_GENERATED = {
    torch.ops.prims.inductor_random.default,
    torch.ops.prims.inductor_lookup_seed.default,
    torch.ops.prims.iota.default,
    torch.ops.aten.full.default,
    torch.ops.aten.scalar_tensor.default,
}


def _fusible(node: torch.fx.Node) -> bool:
    """True for an op inductor generates inside a fused loop (pointwise, reductions, values
    generated from indices or seeds, views, getitems), not an extern or fallback kernel."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or runs_once(node):
        return False
    return (
        torch.Tag.pointwise in target.tags
        or target in _REDUCTIONS
        or target in _GENERATED
        or target.is_view
    )


def _kernels(
    gm: torch.fx.GraphModule, group: dict[str, str]
) -> tuple[dict[str, torch.fx.Node], dict[str, list[str]], dict[str, bool]]:
    """(fx name -> node, group -> its fx names in graph order, group -> all its ops fusible)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    members: dict[str, list[str]] = {}
    for name, g in group.items():
        members.setdefault(g, []).append(name)
    fusible = {g: all(_fusible(nodes[m]) for m in names) for g, names in members.items()}
    return nodes, members, fusible


def fuse_groups(
    gm: torch.fx.GraphModule,
    group: dict[str, str],
    measures: dict[str, NodeMeasure],
    inlined: Mapping[str, Collection[str]] | None = None,
) -> tuple[dict[str, str], dict[str, NodeMeasure]]:
    """Inductor's fusion on capture's groups: a group of fusible ops (`_fusible`) whose every
    reader outside it lies in one other group, of fusible ops in the same phase, joins that
    group, as inductor computes it inside the reader's kernel and never materializes it. The
    storages its ops create then hold 0 bytes. Groups merge from the graph's end, so a
    pointwise chain (a GELU's eight ops) becomes one group holding its last value.
    ``inlined``: reader fx node -> the fx nodes it computes again itself (`inline_reads`):
    those reads are not reads of the producer's value. Returns the new (group, measures); a
    graph output's group stays its own."""
    inlined = inlined or {}
    nodes, members, fusible = _kernels(gm, group)
    position = {name: i for i, name in enumerate(nodes)}
    into = dict(group)
    merged: set[str] = set()
    for g in sorted(members, key=lambda a: -position[a]):
        if not fusible[g]:
            continue
        readers = {
            user.name if user.op == "output" else into[user.name]
            for m in members[g]
            for user in nodes[m].users
            if user.op == "output"
            or (into[user.name] != into[m] and m not in inlined.get(user.name, ()))
        }
        if len(readers) != 1:
            continue
        (w,) = readers
        if w not in fusible or not fusible[w] or phase_of(nodes[w]) != phase_of(nodes[g]):
            continue
        for m in members[g]:
            into[m] = into[w]
        members[w] = members[w] + members.pop(g)
        fusible.pop(g)
        merged.add(g)
    gone = {k for m, g in group.items() if g in merged for k in measures[m].new_storages}
    zeroed = {
        name: dataclasses.replace(
            measure, storages={k: 0 if k in gone else b for k, b in measure.storages.items()}
        )
        for name, measure in measures.items()
    }
    return into, zeroed


def _pointwise(node: torch.fx.Node) -> bool:
    """A fusible op whose output has its inputs' size (no reduction): recomputing it from its
    inputs inside a reader's kernel reads no more than holding it would."""
    return _fusible(node) and node.target not in _REDUCTIONS


def inline_reads(gm: torch.fx.GraphModule, group: dict[str, str]) -> dict[str, list[str]]:
    """Per backward group of fusible ops (`_fusible`): the forward groups it reads that it
    computes again inside its own kernel, as inductor's own partition does (a GELU's backward
    recomputes the tanh, ``1 + tanh`` and ``0.5 * x`` from ``x``), as fx names in graph order.

    A forward group is inlined where all its ops are pointwise (`_pointwise`), it is no graph
    output, and each value it reads from outside is a graph input or a value of a group the
    reader reads anyway (an inlined one included): inlining then never adds to what the reader
    needs live, and drops the values it replaces from it."""
    nodes, members, fusible = _kernels(gm, group)
    position = {name: i for i, name in enumerate(nodes)}
    outputs = {a.name for a in gm.graph.find_nodes(op="output")[0].all_input_nodes}
    candidate = {
        g
        for g, ms in members.items()
        if phase_of(nodes[g]) == "forward"
        and all(_pointwise(nodes[m]) for m in ms)
        and not outputs & set(ms)
    }

    def inputs(names: list[str]) -> set[str]:
        inside = set(names)
        return {a.name for m in names for a in nodes[m].all_input_nodes} - inside

    found: dict[str, list[str]] = {}
    for w, ms in members.items():
        if not fusible[w] or phase_of(nodes[w]) != "backward":
            continue
        direct = {group[a] for a in inputs(ms) if a in group}
        chosen = direct & candidate
        while True:
            keep = {
                g
                for g in chosen
                if all(a not in group or group[a] in direct for a in inputs(members[g]))
            }
            if keep == chosen:
                break
            chosen = keep
        if chosen:
            found[w] = sorted((m for g in chosen for m in members[g]), key=position.__getitem__)
    return found


def _inline(
    gm: torch.fx.GraphModule,
    dag: nx.DiGraph,
    members: dict[str, list[str]],
    inlined: dict[str, list[str]],
    measures: dict[str, NodeMeasure],
) -> None:
    """Rewire each DAG node of ``inlined`` (DAG node -> fx names it computes again) to read
    what its own and its inlined ops read from outside, its cost raised by theirs."""
    nodes = {n.name: n for n in gm.graph.nodes}
    owner = {m: v for v, ms in members.items() for m in ms}
    for w, names in inlined.items():
        inside = set(members[w]) | set(names)
        reads = {a.name for m in inside for a in nodes[m].all_input_nodes} - inside
        dag.remove_edges_from(list(dag.in_edges(w)))
        dag.add_edges_from((owner[a], w) for a in reads if a in owner)
        extra = sum(measures[m].seconds for m in names)
        dag.nodes[w]["cost"] = float(dag.nodes[w]["cost"]) + extra
        dag.nodes[w]["time"] = float(dag.nodes[w]["time"]) + extra


def joint_dag(gm: torch.fx.GraphModule, held_bytes: int = 0, fuse: bool = False) -> JointDag:
    """The DAG of ``gm`` (a joint forward+backward graph), costs in predicted seconds.

    ``held_bytes`` is added to every node's ``transient`` (bytes held beside the DAG's values
    throughout the step). ``fuse``: model inductor's fusion (`fuse_groups`). DAG nodes get
    ``once``: a member draws random numbers or mutates, so it may not be recomputed. Raises
    `CompileError` for symbolic shapes."""
    _tag_backward(gm)
    measures = _measures(gm)
    group = group_ops(gm, measures)
    by_group: dict[str, list[str]] = {}
    if fuse:
        # which reads a fused backward kernel recomputes, then the fusion those leave
        fused, _ = fuse_groups(gm, group, measures)
        by_group = inline_reads(gm, fused)
        by_reader = {r: set(by_group[w]) for r, w in fused.items() if w in by_group}
        group, measures = fuse_groups(gm, group, measures, by_reader)
    order = op_group_order(gm, group)
    try:
        dag, members = build_dag(gm, measures, group, order, "time", held_bytes=held_bytes)
    except CaptureError as e:
        raise CompileError(f"cannot build remat's graph from the joint graph: {e}") from e
    # the second fusion merges forward groups only: each reader keeps its group and its
    # inlined names, already in graph order
    inlined = {group[w]: names for w, names in by_group.items()}
    _inline(gm, dag, members, inlined, measures)
    nodes = {n.name: n for n in gm.graph.nodes}
    for v in dag.nodes:
        dag.nodes[v]["once"] = any(runs_once(nodes[m]) for m in members[v])
        dag.nodes[v]["mutates"] = any(_mutates(nodes[m]) for m in members[v])
    outputs = [v for v in dag.nodes if dag.nodes[v]["is_output"]]
    dag.add_node(END, **{**dag.nodes[order[-1]], "name": END, "op": "end", "mem": 0})
    dag.nodes[END].update(cost=0.0, time=0.0, flops=0, temp_mem=0, op_transient=0)
    dag.nodes[END].update(
        transient=held_bytes, once=False, mutates=False, is_output=False, module=""
    )
    dag.add_edges_from((v, END) for v in outputs)
    dag.graph["order"] = [*order, END]
    members[END] = []
    return JointDag(dag, members, inlined)
