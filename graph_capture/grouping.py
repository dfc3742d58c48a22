"""Partition the joint graph's fx nodes into the solver's nodes (groups).

Op granularity (`group_ops`), exact by construction:

- an op that allocates new storage starts a group (its "anchor");
- a ``getitem`` of a multi-output op read only by the other phase (see `is_saved_output`)
  starts its own group, owning its storage;
- an op whose outputs only alias storage of one group (views, ``getitem``, ``detach``) joins
  that group: it is free to compute and cannot outlive the storage it views, so keeping it
  as a separate node would let a schedule "free" bytes that a view still holds;
- an op that allocates nothing and aliases only static memory (``t`` of a weight, views of a
  tangent) joins its single consumer when that consumer is in the same phase, otherwise it
  is its own zero-byte node.

Module granularity (`group_modules`): maximal runs of consecutive op groups (in the op-level
topological order) that share a phase and a module path, truncated to ``depth`` components.
Runs of a topological order merge without creating cycles.
"""

from __future__ import annotations

import operator

import torch

from graph_capture.errors import CaptureError
from graph_capture.measurement.measure import NodeMeasure
from graph_capture.trace.fx_nodes import describe_op, module_of, phase_of


def _reader_phases(node: torch.fx.Node, measures: dict[str, NodeMeasure]) -> set[str]:
    """Phases of the ops that read ``node``'s value, directly or through views of it."""
    phases: set[str] = set()
    for user in node.users:
        if user.op != "call_function":
            continue
        if measures[user.name].new_storages or not measures[user.name].storages:
            phases.add(phase_of(user))
        else:
            phases |= _reader_phases(user, measures) or {phase_of(user)}
    return phases


def is_saved_output(node: torch.fx.Node, measures: dict[str, NodeMeasure]) -> bool:
    """True for a ``getitem`` of a multi-output op that only the other phase reads, when no
    other output of that op is read by both phases (which would keep the op's node alive).

    Such an output (BatchNorm's saved mean/rstd and new running stats) gets its own DAG node
    owning its storage, so keeping it for the backward does not keep the op's forward-only
    outputs alive. While the op's node is still live, the solver counts that storage twice:
    a transient, safe overestimate of one small tensor (the op's node has no other reader).
    """
    if node.target is not operator.getitem or not node.users:
        return False
    (source,) = node.all_input_nodes
    other = "backward" if phase_of(source) == "forward" else "forward"
    if _reader_phases(node, measures) != {other}:
        return False
    mine = set(measures[node.name].storages)
    for sibling in source.users:
        if sibling is node:
            continue
        if mine & set(measures[sibling.name].storages):
            return False
        phases = _reader_phases(sibling, measures)
        if other in phases and phases != {other}:
            return False  # that output keeps the op's node alive into the other phase anyway
    return True


def group_ops(gm: torch.fx.GraphModule, measures: dict[str, NodeMeasure]) -> dict[str, str]:
    """Map every computing fx node to the anchor name of its op-level group (rules above)."""
    owner: dict[object, str] = {}
    group: dict[str, str] = {}
    free: list[torch.fx.Node] = []
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    for node in nodes:
        measure = measures[node.name]
        aliased = {owner[k] for k in measure.storages if k in owner}
        if measure.new_storages:
            if aliased:
                raise CaptureError(
                    f"{describe_op(node)} returns new memory together with an alias of the output "
                    f"of {sorted(aliased)}; this output layout is not supported"
                )
            group[node.name] = node.name
            owner.update(dict.fromkeys(measure.new_storages, node.name))
        elif aliased and is_saved_output(node, measures):
            group[node.name] = node.name
            owner.update(dict.fromkeys(measure.storages, node.name))
        elif aliased:
            if len(aliased) > 1:
                raise CaptureError(
                    f"{describe_op(node)} aliases the outputs of several ops {sorted(aliased)}"
                )
            (target,) = aliased
            readers = {group[n.name] for n in node.all_input_nodes if n.name in group}
            if readers - {target}:
                raise CaptureError(
                    f"{describe_op(node)} aliases the output of '{target}' but also reads "
                    f"{sorted(readers - {target})}; cannot place it exactly"
                )
            group[node.name] = target
        else:
            free.append(node)
    for node in reversed(free):
        consumers = list(node.users)
        only = consumers[0] if len(consumers) == 1 else None
        if only is not None and only.op == "call_function" and phase_of(only) == phase_of(node):
            group[node.name] = group[only.name]
        else:
            group[node.name] = node.name
    return group


def op_group_order(gm: torch.fx.GraphModule, group: dict[str, str]) -> list[str]:
    """Group anchors sorted forward first, then by the anchor's position in the graph."""
    position = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    nodes = {n.name: n for n in gm.graph.nodes}
    anchors = set(group.values())
    return sorted(anchors, key=lambda a: (phase_of(nodes[a]) == "backward", position[a]))


def group_modules(
    gm: torch.fx.GraphModule,
    group: dict[str, str],
    order: list[str],
    depth: int | None = None,
) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Merge consecutive op groups of one module and phase.

    Returns (fx node -> group id, group order, group id -> module path).

    A merged group's id is the anchor of its last op group (usually the module's output).
    ``depth`` truncates module paths ("blocks.0.attn" at depth 2 is "blocks.0").
    """
    nodes = {n.name: n for n in gm.graph.nodes}

    def key(anchor: str) -> tuple[str, str]:
        path = module_of(nodes[anchor])
        if depth is not None:
            path = ".".join(path.split(".")[:depth]) if path else path
        return phase_of(nodes[anchor]), path

    runs: list[list[str]] = []
    for anchor in order:
        if runs and key(runs[-1][-1]) == key(anchor):
            runs[-1].append(anchor)
        else:
            runs.append([anchor])
    renamed = {anchor: run[-1] for run in runs for anchor in run}
    paths = {run[-1]: key(run[-1])[1] for run in runs}
    return {n: renamed[g] for n, g in group.items()}, [run[-1] for run in runs], paths
