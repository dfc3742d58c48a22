"""What `benchmarks.running.offload_compare`'s predicted H100 step is computed from: the
captured DAG's node seconds from estimate mode's H100 roofline (`h100_costs`), and torchtune's
copies as ops on the keep-all schedule (`torchtune_ops`), for `solver.simulate` over the H100's
host link."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import networkx as nx
from torch import nn

from graph_capture import capture


def h100_costs(
    captured_dag: nx.DiGraph, model: nn.Module, inputs: Sequence, granularity: str
) -> None:
    """Set every node's ``cost`` of `captured_dag` to estimate mode's H100 seconds."""
    estimated = capture(model, inputs, granularity=granularity, target="h100").dag
    for name, data in captured_dag.nodes(data=True):
        data["cost"] = data["time"] = estimated.nodes[name]["cost"]


def torchtune_ops(
    graph: nx.DiGraph,
    keep_all: Sequence[tuple[str, Hashable]],
    min_offload_bytes: int = 1024,
    max_fwd_stash: int = 5,
) -> list[tuple[str, Hashable]]:
    """torchtune's copies as ops on the keep-all schedule `keep_all`: each forward value that a
    backward node reads with at least `min_offload_bytes` bytes is offloaded right after its
    compute, freed after its last forward read or `max_fwd_stash` offloads later (whichever
    comes later) and reloaded right before its first backward read."""
    backward = {v for v, d in graph.nodes(data=True) if d.get("backward")}
    saved = [
        v
        for kind, v in keep_all
        if kind == "compute"
        and v not in backward
        and graph.nodes[v]["mem"] >= min_offload_bytes
        and any(s in backward for s in graph.successors(v))
    ]
    position = {v: i for i, (kind, v) in enumerate(keep_all) if kind == "compute"}
    free_after: dict[int, list[Hashable]] = {}
    for k, v in enumerate(saved):
        forward_reads = [position[s] for s in graph.successors(v) if s not in backward]
        later = position[saved[k + max_fwd_stash]] if k + max_fwd_stash < len(saved) else None
        first_backward = min(position[s] for s in graph.successors(v) if s in backward)
        at = max([position[v], *forward_reads, *([later] if later is not None else [])])
        if at < first_backward:
            free_after.setdefault(at, []).append(v)
    reload_before: dict[int, list[Hashable]] = {}
    for at_list in free_after.values():
        for v in at_list:
            first = min(position[s] for s in graph.successors(v) if s in backward)
            reload_before.setdefault(first, []).append(v)
    freed = {v for vs in free_after.values() for v in vs}
    offloaded = set(saved)
    ops: list[tuple[str, Hashable]] = []
    for i, (kind, v) in enumerate(keep_all):
        if kind == "free" and v in freed:
            continue  # freed at its own place below, or already
        ops.extend(("reload", u) for u in reload_before.get(i, []))
        ops.append((kind, v))
        if kind == "compute" and v in offloaded:
            ops.append(("offload", v))
        ops.extend(("free", u) for u in free_after.get(i, []))
    return _free_reloaded(graph, ops, freed, backward, position)


def _free_reloaded(
    graph: nx.DiGraph,
    ops: list[tuple[str, Hashable]],
    reloaded: set[Hashable],
    backward: set[Hashable],
    position: dict[Hashable, int],
) -> list[tuple[str, Hashable]]:
    """Free each reloaded value after its last backward read (its keep-all free was dropped)."""
    last = {v: max(position[s] for s in graph.successors(v) if s in backward) for v in reloaded}
    by_reader: dict[Hashable, list[Hashable]] = {}
    order = {position[v]: v for v in position}
    for v, at in last.items():
        by_reader.setdefault(order[at], []).append(v)
    out = []
    for kind, v in ops:
        out.append((kind, v))
        if kind == "compute":
            out.extend(("free", u) for u in by_reader.get(v, []))
    return out
