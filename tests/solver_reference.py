"""Independent reference solvers for small graphs, written without the package's solver code.

- `stage_space_frontier`: exhaustive dynamic programming over Checkmate-style stage plans (stage t
  computes node t for the first time plus any subset of earlier nodes; any subset of live values is
  carried to the next stage; values are freed right after their last use in a stage). Returns the
  Pareto set of (cost, peak) pairs, so it answers both objectives.
- `general_space_min_cost`: Dijkstra over every compute/free op sequence (not only staged ones),
  optionally only those computing the nodes for the first time in a given order: a lower bound
  on the stage-space optimum.
Both count a compute's peak as the bytes live just after it plus the node's `transient` bytes.
Both enumerate exponentially many plans: use them on graphs of at most about 6 nodes.
"""

from __future__ import annotations

import heapq
import itertools
import math

import networkx as nx


def _order(graph: nx.DiGraph) -> list:
    return (
        list(graph.graph["order"])
        if "order" in graph.graph
        else list(
            nx.lexicographical_topological_sort(
                graph, key={v: i for i, v in enumerate(graph.nodes)}.__getitem__
            )
        )
    )


def _subsets(items):
    items = list(items)
    for r in range(len(items) + 1):
        yield from itertools.combinations(items, r)


def _stage_peak(graph, live_at_start, stage, keep_next):
    """Peak bytes of one stage (nodes in topological order) with eager frees, or None when a
    compute lacks an input or recomputes a live value."""
    live = set(live_at_start)
    peak = 0
    for idx, v in enumerate(stage):
        if v in live or any(u not in live for u in graph.predecessors(v)):
            return None
        live.add(v)
        peak = max(peak, sum(graph.nodes[u]["mem"] for u in live) + _transient(graph, v))
        later = stage[idx + 1 :]
        for u in (*graph.predecessors(v), v):
            if u not in keep_next and not any(w in later for w in graph.successors(u)):
                live.discard(u)
    return peak


def _transient(graph: nx.DiGraph, v) -> int:
    """Bytes v's op holds while it runs beyond its inputs and output (0 when not given)."""
    return graph.nodes[v].get("transient", 0)


def stage_space_frontier(graph: nx.DiGraph) -> set[tuple[float, int]]:
    """Pareto-optimal (cost, peak) pairs over all stage plans of `graph`."""
    order = _order(graph)
    cost = {v: graph.nodes[v]["cost"] for v in order}
    # state: carried frozenset -> list of (cost, peak) non-dominated
    states: dict[frozenset, set[tuple[float, int]]] = {frozenset(): {(0.0, 0)}}
    for t, node in enumerate(order):
        earlier = order[:t]
        nxt: dict[frozenset, set[tuple[float, int]]] = {}
        for carried, labels in states.items():
            for extra in _subsets(v for v in earlier if v not in carried):
                stage = (*extra, node)  # earlier ⊂ order, so the stage is in topological order
                available = set(carried) | set(stage)
                for keep in _subsets(sorted(available, key=order.index)):
                    keep_set = frozenset(keep)
                    # carried values not used in this stage and not kept are dropped at its start
                    used = {u for v in stage for u in graph.predecessors(v)}
                    start = {u for u in carried if u in used or u in keep_set}
                    peak = _stage_peak(graph, start, stage, keep_set)
                    if peak is None:
                        continue
                    c = sum(cost[v] for v in stage)
                    bucket = nxt.setdefault(keep_set, set())
                    for lc, lp in labels:
                        bucket.add((lc + c, max(lp, peak)))
        states = {k: _pareto(v) for k, v in nxt.items()}
    return _pareto(set().union(*states.values()))


def _pareto(points: set[tuple[float, int]]) -> set[tuple[float, int]]:
    best: set[tuple[float, int]] = set()
    for c, p in sorted(points):
        if not any(bp <= p for _, bp in best):
            best.add((c, p))
    return best


def min_cost_within(frontier: set[tuple[float, int]], budget: int) -> float | None:
    """Least cost with peak <= budget, or None."""
    fits = [c for c, p in frontier if p <= budget]
    return min(fits) if fits else None


def general_space_min_cost(
    graph: nx.DiGraph, budget: int, first_order: list | None = None
) -> float | None:
    """Least cost over all valid op sequences with peak <= budget (Dijkstra), or None. With
    `first_order`, only the sequences whose first computes of the nodes come in that order."""
    nodes = list(graph.nodes)
    rank = None if first_order is None else {v: i for i, v in enumerate(first_order)}
    mem = {v: graph.nodes[v]["mem"] for v in nodes}
    start = (frozenset(), frozenset())
    heap = [(0.0, 0, start)]
    best = {start: 0.0}
    counter = itertools.count(1)
    while heap:
        c, _, (live, done) = heapq.heappop(heap)
        if c > best.get((live, done), math.inf):
            continue
        if len(done) == len(nodes):
            return c
        moves = []
        for v in nodes:
            if v in live:
                moves.append((c, (live - {v}, done)))
            elif (
                all(u in live for u in graph.predecessors(v))
                and sum(mem[u] for u in live) + mem[v] + _transient(graph, v) <= budget
                and (rank is None or v in done or rank[v] == len(done))
            ):
                moves.append((c + graph.nodes[v]["cost"], (live | {v}, done | {v})))
        for nc, state in moves:
            if nc < best.get(state, math.inf):
                best[state] = nc
                heapq.heappush(heap, (nc, next(counter), state))
    return None
