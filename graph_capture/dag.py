"""Build the solver's `networkx.DiGraph` from a grouping of the joint graph's fx nodes."""

from __future__ import annotations

import hashlib
import json
import operator

import networkx as nx
import torch

from graph_capture.errors import CaptureError
from graph_capture.measurement.measure import NodeMeasure, is_random
from graph_capture.measurement.transient import group_transient
from graph_capture.trace.fx_nodes import module_of, phase_of
from solver.errors import ArgumentError


def build_dag(
    gm: torch.fx.GraphModule,
    measures: dict[str, NodeMeasure],
    group: dict[str, str],
    order: list[str],
    cost_model: str,
    modules: dict[str, str] | None = None,
    held_bytes: int = 0,
) -> tuple[nx.DiGraph, dict[str, list[str]]]:
    """One DAG node per group, attributes as documented in `graph_capture.captured`.

    ``group`` maps fx node name -> group id, ``order`` lists the group ids topologically
    (checked here), ``modules`` overrides a group's module path (default: its anchor's).
    ``held_bytes``: what the executor holds beside the DAG's values during the step, added to
    every node's ``transient`` on top of the bytes its op holds (``op_transient``).
    Returns (dag, members). O(nodes + edges).
    """
    if cost_model not in ("time", "flops"):
        raise ArgumentError(f"cost_model must be 'time' or 'flops', not {cost_model!r}")
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    members: dict[str, list[str]] = {g: [] for g in order}
    for node in nodes:
        members[group[node.name]].append(node.name)
    exported: dict[str, set] = {g: set() for g in order}
    created: dict[str, dict] = {g: {} for g in order}
    edges: set[tuple[str, str]] = set()
    outputs: set[str] = set()
    for node in nodes:
        g = group[node.name]
        measure = measures[node.name]
        created[g].update({k: measure.storages[k] for k in measure.new_storages})
        if g == node.name and node.target is operator.getitem:
            created[g].update(measure.storages)  # a saved output of a multi-output op
        for user in node.users:
            if user.op == "output" or group.get(user.name) != g:
                exported[g].update(measure.storages)
            if user.op == "output":
                outputs.add(g)
            elif group[user.name] != g:
                edges.add((g, group[user.name]))
    dag = nx.DiGraph()
    by_name = {n.name: n for n in nodes}
    for g in order:
        anchor = by_name[g]
        member_measures = [measures[m] for m in members[g]]
        mem = sum(nbytes for k, nbytes in created[g].items() if k in exported[g])
        seconds = sum(m.seconds for m in member_measures)
        flops = sum(m.flops for m in member_measures)
        phase = phase_of(anchor)
        op_transient = group_transient([by_name[m] for m in members[g]], measures, mem)
        dag.add_node(
            g,
            name=g,
            op=str(anchor.target),
            mem=int(mem),
            temp_mem=int(sum(created[g].values()) - mem),
            op_transient=op_transient,
            transient=op_transient + held_bytes,
            cost=float(seconds) if cost_model == "time" else int(flops),
            time=float(seconds),
            flops=int(flops),
            flops_counted=int(sum(m.flops_counted for m in member_measures)),
            phase=phase,
            backward=phase == "backward",
            module=modules[g] if modules else module_of(anchor),
            random=any(is_random(by_name[m]) for m in members[g]),
            shapes=measures[g].shapes,
            dtypes=measures[g].dtypes,
            is_output=g in outputs,
        )
    dag.add_edges_from(edges)
    _check_order(dag, order)
    dag.graph["order"] = list(order)
    return dag, members


def _check_order(dag: nx.DiGraph, order: list[str]) -> None:
    position = {v: i for i, v in enumerate(order)}
    for u, v in dag.edges:
        if position[u] >= position[v]:
            raise CaptureError(
                f"grouping produced a dependency against the order: '{u}' -> '{v}' "
                f"(modules '{dag.nodes[u]['module']}', '{dag.nodes[v]['module']}'); "
                "try granularity='op'"
            )
    seen_backward = False
    for v in order:
        if dag.nodes[v]["backward"]:
            seen_backward = True
        elif seen_backward:
            raise CaptureError(f"forward node '{v}' comes after a backward node in the order")


def structure_fingerprint(dag: nx.DiGraph) -> str:
    """SHA-256 (32 hex digits) of what a schedule's ops refer to and what the graph computes:
    the node ids in ``order``, each node's op, output shapes and dtypes, and its predecessors.
    Bytes and costs are left out: a capture measured here and one estimated for a target
    (`graph_capture.capture`'s ``target``) of the same model and shapes share it."""
    payload = [
        [
            str(v),
            dag.nodes[v]["op"],
            [list(s) for s in dag.nodes[v]["shapes"]],
            dag.nodes[v]["dtypes"],
            sorted(str(u) for u in dag.predecessors(v)),
        ]
        for v in dag.graph["order"]
    ]
    blob = json.dumps(payload, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]
