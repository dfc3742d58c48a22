"""The solver's view of a computation graph: validation, node order and fingerprint.

Contract (what every graph handed to the solver must satisfy):

- a `networkx.DiGraph`, acyclic; an edge u -> v means v reads u's output;
- every node has `mem` (int >= 0: bytes of its output while it is alive) and `cost`
  (number >= 0: cost to compute it once, in whatever unit the graph uses: seconds, FLOPs, ...);
- graph inputs and parameters are not nodes: they are static memory outside the budget;
- the graph attribute `order` (a list of all nodes, topological) fixes the node order; without it
  the order is networkx's lexicographical topological sort keyed by insertion position, which is
  deterministic for a given graph.

`Problem` is the validated, index-based form the solvers work on: node i is `order[i]`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable
from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from solver.errors import GraphError


@dataclass(frozen=True)
class Problem:
    """A validated graph in index form. Node i is `ids[i]`; indices follow the topological order.

    Attributes:
        ids: node ids of the original graph, in solver order.
        mem: bytes of each node's output.
        cost: cost of computing each node once (graph units).
        preds: for each node, the indices of the nodes it reads, ascending.
        succs: for each node, the indices of the nodes that read it, ascending.
        backward: for each node, whether it belongs to the backward pass (False where unknown).
    """

    ids: tuple[Hashable, ...]
    mem: tuple[int, ...]
    cost: tuple[float, ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    backward: tuple[bool, ...]

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.ids)

    @cached_property
    def index(self) -> dict[Hashable, int]:
        """Node id -> index."""
        return {v: i for i, v in enumerate(self.ids)}

    @cached_property
    def has_phases(self) -> bool:
        """True when the graph marks some nodes as backward (a forward+backward training graph)."""
        return any(self.backward)

    @cached_property
    def total_cost(self) -> float:
        """Cost of computing every node exactly once (the checkpoint-all cost)."""
        return math.fsum(self.cost)

    @cached_property
    def last_user(self) -> tuple[int, ...]:
        """Per node, its last user in solver order (the node itself when it has none)."""
        return tuple(max(users, default=v) for v, users in enumerate(self.succs))

    @cached_property
    def memory_lower_bound(self) -> int:
        """Bytes no schedule can go below: some node plus all of its inputs must be live at once."""
        return max(
            (self.mem[v] + sum(self.mem[p] for p in self.preds[v]) for v in range(self.n)),
            default=0,
        )

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the node ids, order, edges and `mem`: what a schedule's validity depends on.

        `cost` is left out on purpose: measured times change between captures of the same model,
        but a schedule stays valid (and its peak unchanged) for any costs.
        """
        payload = {
            "ids": [_id_key(v) for v in self.ids],
            "mem": list(self.mem),
            "preds": [list(p) for p in self.preds],
        }
        blob = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:32]


def _id_key(v: Hashable) -> str:
    return f"{type(v).__name__}:{v}"


def _number(graph: nx.DiGraph, v: Hashable, key: str) -> float:
    attrs = graph.nodes[v]
    if key not in attrs:
        raise GraphError(
            f"node {v!r} has no {key!r} attribute; every node needs `mem` (bytes of its output) "
            f"and `cost` (cost to compute it). Load published graphs with solver.load_graph."
        )
    value = attrs[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GraphError(f"node {v!r}: {key}={value!r} is not a finite number")
    if value < 0:
        raise GraphError(f"node {v!r}: {key}={value!r} is negative; {key} must be >= 0")
    return value


def _order(graph: nx.DiGraph) -> list[Hashable]:
    if "order" not in graph.graph:
        position = {v: i for i, v in enumerate(graph.nodes)}
        return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    order = list(graph.graph["order"])
    if len(order) != graph.number_of_nodes() or set(order) != set(graph.nodes):
        raise GraphError(
            "graph attribute `order` must list every node exactly once "
            f"({len(order)} entries for {graph.number_of_nodes()} nodes)"
        )
    position = {v: i for i, v in enumerate(order)}
    for u, v in graph.edges:
        if position[u] >= position[v]:
            raise GraphError(
                f"graph attribute `order` is not topological: edge {u!r} -> {v!r} goes backwards"
            )
    return order


def prepare(graph: nx.DiGraph) -> Problem:
    """Validate `graph` against the solver contract and return its index form.

    Raises GraphError (with the offending node or cycle) when the graph is not a DAG, a node lacks
    `mem`/`cost`, a value is negative or not finite, `mem` is not an integer, or `order` is not a
    topological order of all nodes. O(V + E).
    """
    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise GraphError(f"expected a networkx.DiGraph, got {type(graph).__name__}")
    if graph.number_of_nodes() == 0:
        raise GraphError("the graph has no nodes")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise GraphError(f"the graph has a cycle: {' -> '.join(repr(u) for u, _ in cycle)}")
    order = _order(graph)
    index = {v: i for i, v in enumerate(order)}
    mem: list[int] = []
    for v in order:
        m = _number(graph, v, "mem")
        if m != int(m):
            raise GraphError(f"node {v!r}: mem={m!r} must be a whole number of bytes")
        mem.append(int(m))
    cost = [float(_number(graph, v, "cost")) for v in order]
    preds = tuple(tuple(sorted(index[u] for u in graph.predecessors(v))) for v in order)
    succs = tuple(tuple(sorted(index[w] for w in graph.successors(v))) for v in order)
    backward = tuple(_is_backward(graph.nodes[v]) for v in order)
    return Problem(tuple(order), tuple(mem), tuple(cost), preds, succs, backward)


def _is_backward(attrs: dict) -> bool:
    if "phase" in attrs:
        return attrs["phase"] == "backward"
    return bool(attrs.get("backward", False))
