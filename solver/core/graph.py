"""The solver's view of a computation graph: validation, node order and fingerprint.

Contract (what every graph handed to the solver must satisfy):

- a `networkx.DiGraph`, acyclic; an edge u -> v means v reads u's output;
- every node has `mem` (int >= 0: bytes of its output while it is alive) and `cost`
  (number >= 0: cost to compute it once, in whatever unit the graph uses: seconds, FLOPs, ...);
- a node may have `transient` (int >= 0, default 0): bytes the op holds while it runs beyond its
  inputs and its output (workspaces, temporaries), counted at its compute only;
- graph inputs and parameters are not nodes: they are static memory outside the budget;
- the graph attribute `order` (a list of all nodes, topological) fixes the node order; without it
  the order is networkx's lexicographical topological sort keyed by insertion position, which is
  deterministic for a given graph;
- the graph attribute `step_cost` (number > 0, optional; graph units) is the measured cost of one
  plain step, what runs between the ops included (captures with the time cost model set it):
  the denominator of a schedule's predicted step-time overhead (`Problem.overhead`);
- the graph attribute `plain_peak` (whole number > 0, optional; bytes) is the measured peak of
  one plain training step (captures set it): 100% of a percentage budget
  (`solver.core.budget.hundred_percent`).

`Problem` is the validated, index-based form the solvers work on: node i is `order[i]`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from solver.core.peak_floor import pending_inputs_floor
from solver.errors import GraphError


@dataclass(frozen=True)
class Problem:
    """A validated graph in index form. Node i is `ids[i]`; indices follow the topological order.

    Attributes:
        ids: node ids of the original graph, in solver order.
        mem: bytes of each node's output.
        cost: cost of computing each node once (graph units).
        transient: bytes each node's op holds while it runs beyond its inputs and output.
        preds: for each node, the indices of the nodes it reads, ascending.
        succs: for each node, the indices of the nodes that read it, ascending.
        backward: for each node, whether it belongs to the backward pass (False where unknown).
        module: for each node, the dotted path of the nn.Module it came from ("" where unknown;
            the node attribute `module` of captured graphs).
        step_cost: measured cost of one plain step (graph units; the graph attribute
            `step_cost`), or None where the graph has none.
        plain_peak: peak bytes of one plain step (the graph attribute `plain_peak`), or None
            where the graph has none.
        plain_peak_basis: "measured", or "predicted" where `plain_peak` is an estimate mode's
            (the graph attribute `plain_peak_basis`).
        held: (part, bytes) of what a runtime holds beside the values at every op, included in
            every node's `transient` (the graph attribute `held_bytes`, a mapping; captured
            graphs: `graph_capture.capture`'s executor bytes), () where the graph has none.
            Every schedule's peak includes their sum.
    """

    ids: tuple[Hashable, ...]
    mem: tuple[int, ...]
    cost: tuple[float, ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    backward: tuple[bool, ...]
    transient: tuple[int, ...] = ()
    module: tuple[str, ...] = ()
    step_cost: float | None = None
    plain_peak: int | None = None
    plain_peak_basis: str = "measured"
    held: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.transient:  # no transient bytes given: 0 for every node
            object.__setattr__(self, "transient", (0,) * len(self.ids))
        if not self.module:  # no module paths given: unknown for every node
            object.__setattr__(self, "module", ("",) * len(self.ids))

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

    def overhead(self, cost: float) -> float:
        """Predicted step-time overhead of a schedule costing `cost`: its recomputation
        (`cost - total_cost`) over one plain step, `step_cost` where measured (it counts what a
        step spends between ops, which no node's cost does), else `total_cost`. 0.25 = a step
        25% slower than the plain one."""
        return (cost - self.total_cost) / (self.step_cost or self.total_cost or 1.0)

    @cached_property
    def last_user(self) -> tuple[int, ...]:
        """Per node, its last user in solver order (the node itself when it has none)."""
        return tuple(max(users, default=v) for v, users in enumerate(self.succs))

    @cached_property
    def last_descendant(self) -> tuple[int, ...]:
        """Per node, the last node in solver order that depends on it through a path of users
        (the node itself when it has none): after that stage nothing can read it again, not
        even to recompute another value."""
        last = list(range(self.n))
        for v in reversed(range(self.n)):
            for j in self.succs[v]:
                last[v] = max(last[v], last[j])
        return tuple(last)

    @cached_property
    def memory_lower_bound(self) -> int:
        """Bytes no schedule can go below: computing a node needs its output, all of its inputs
        and its transient bytes at once (the one-line bound), raised where the input computed
        last was computed beside the others (`solver.core.peak_floor`)."""
        return max(self.one_line_floor, pending_inputs_floor(self.mem, self.transient, self.preds))

    @cached_property
    def one_line_floor(self) -> int:
        """Bytes no schedule goes below, with offload too: the largest `compute_floor` (the
        one-line bound; `memory_lower_bound` raises it where an input computed last was computed
        beside the others, which a schedule that reloads an input does not need)."""
        return max((self.compute_floor(v) for v in range(self.n)), default=0)

    def compute_floor(self, v: int) -> int:
        """Bytes computing node v needs whatever else is live: its output, its inputs and its
        transient bytes."""
        return self.mem[v] + sum(self.mem[p] for p in self.preds[v]) + self.transient[v]

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the node ids, order, edges, `mem` and `transient`: what a schedule's
        validity and peak depend on (`transient` only where some node has it, so graphs without
        transient bytes keep their fingerprints).

        `cost` is left out on purpose: measured times change between captures of the same model,
        but a schedule stays valid (and its peak unchanged) for any costs.
        """
        payload = {
            "ids": [_id_key(v) for v in self.ids],
            "mem": list(self.mem),
            "preds": [list(p) for p in self.preds],
        }
        if any(self.transient):
            payload["transient"] = list(self.transient)
        return _digest(payload)

    @cached_property
    def cost_fingerprint(self) -> str:
        """SHA-256 of the costs in node order: what a schedule's cost (and a claim that it is
        optimal) depends on, beyond `fingerprint`."""
        return _digest([repr(float(c)) for c in self.cost])


def _digest(payload: object) -> str:
    blob = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _id_key(v: Hashable) -> str:
    return f"{type(v).__name__}:{v}"


def _number(graph: nx.DiGraph, v: Hashable, key: str, default: float | None = None) -> float:
    attrs = graph.nodes[v]
    if key not in attrs and default is not None:
        return default
    if key not in attrs:
        raise GraphError(
            f"node {v!r} has no {key!r} attribute; every node needs `mem` (bytes of its output) "
            f"and `cost` (cost to compute it). Load published graphs with solver.load_graph."
        )
    value = attrs[key]
    if not _is_finite_number(value):
        raise GraphError(f"node {v!r}: {key}={value!r} is not a finite number")
    if value < 0:
        raise GraphError(f"node {v!r}: {key}={value!r} is negative; {key} must be >= 0")
    return value


def _order(graph: nx.DiGraph) -> list[Hashable]:
    if "order" not in graph.graph:
        position = {v: i for i, v in enumerate(graph.nodes)}
        return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    order = graph.graph["order"]
    if not isinstance(order, list | tuple) or not all(_hashable(v) for v in order):
        raise GraphError("graph attribute `order` must be a list of the graph's node ids")
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
    return list(order)


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def prepare(graph: nx.DiGraph) -> Problem:
    """Validate `graph` against the solver contract and return its index form.

    Raises GraphError (with the offending node or cycle) when the graph is not a DAG, a node lacks
    `mem`/`cost`, a value is negative or not finite, `mem` or `transient` is not an integer, or
    `order` is not a topological order of all nodes. O(V + E).
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
    mem = [_bytes(graph, v, "mem") for v in order]
    transient = [_bytes(graph, v, "transient", 0) for v in order]
    cost = [float(_number(graph, v, "cost")) for v in order]
    preds = tuple(tuple(sorted(index[u] for u in graph.predecessors(v))) for v in order)
    succs = tuple(tuple(sorted(index[w] for w in graph.successors(v))) for v in order)
    backward = tuple(_is_backward(graph.nodes[v]) for v in order)
    module = tuple(str(graph.nodes[v].get("module") or "") for v in order)
    return Problem(
        tuple(order),
        tuple(mem),
        tuple(cost),
        preds,
        succs,
        backward,
        tuple(transient),
        module,
        _step_cost(graph),
        _plain_peak(graph),
        _plain_peak_basis(graph),
        _held(graph),
    )


def _step_cost(graph: nx.DiGraph) -> float | None:
    value = graph.graph.get("step_cost")
    if value is None:
        return None
    if not _is_finite_number(value) or value <= 0:
        raise GraphError(f"graph attribute `step_cost`={value!r} is not a finite number > 0")
    return float(value)


def _plain_peak_basis(graph: nx.DiGraph) -> str:
    value = graph.graph.get("plain_peak_basis", "measured")
    if value not in ("measured", "predicted"):
        raise GraphError(
            f"graph attribute `plain_peak_basis`={value!r} is not 'measured' or 'predicted'"
        )
    return value


def _plain_peak(graph: nx.DiGraph) -> int | None:
    value = graph.graph.get("plain_peak")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise GraphError(f"graph attribute `plain_peak`={value!r} is not a whole number > 0")
    return value


def _held(graph: nx.DiGraph) -> tuple[tuple[str, int], ...]:
    value = graph.graph.get("held_bytes", {})
    parts = tuple(value.items()) if isinstance(value, Mapping) else None
    if parts is None or not all(
        isinstance(k, str) and isinstance(b, int) and not isinstance(b, bool) and b >= 0
        for k, b in parts
    ):
        raise GraphError(
            f"graph attribute `held_bytes`={value!r} is not a mapping of names to whole "
            "numbers of bytes >= 0"
        )
    return parts


def _is_finite_number(value: object) -> bool:
    """An int or float (not a bool), neither infinite nor NaN."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _bytes(graph: nx.DiGraph, v: Hashable, key: str, default: int | None = None) -> int:
    value = _number(graph, v, key, default)
    if value != int(value):
        raise GraphError(f"node {v!r}: {key}={value!r} must be a whole number of bytes")
    return int(value)


def _is_backward(attrs: dict) -> bool:
    if "phase" in attrs:
        return attrs["phase"] == "backward"
    return bool(attrs.get("backward", False))
