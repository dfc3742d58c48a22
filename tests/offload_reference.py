"""An exhaustive reference for the stage space with offload (docs/offload.md), written without
the package's code.

`offload_min_cost(graph, budget, d2h, h2d, host_memory, host_bytes, latency=(0, 0),
duplex=True)` searches every stage plan of the space: per stage, any set of earlier values
recomputed, any set of host copies reloaded (each read in the stage or kept), whether the
stage's node is offloaded, any set of live values kept, and, with a host limit, any set of host
copies retired after the stage's reloads (never reloaded again). A retired copy's host bytes
(`host_bytes(mem)`, the mem itself by default) are held until the clock has waited for its last
reload: the first compute reading the reloaded value, or its free. Each stage's ops
(docs/offload.md, "The stage space with offload") run on the timeline of docs/offload.md, "Ops
and their timeline". Dynamic programming over (live set, first copies, host copies, retired
copies still held, copy times relative to the clock) with the least clock per state: the future
of a state depends only on the relative times. A copy takes its direction's latency plus its
bytes over its bandwidth, on its direction's engine, or on the one engine both directions share
where `duplex` is False. Exponential: graphs of at most about 5 nodes.
"""

from __future__ import annotations

import itertools
import math

import networkx as nx


def _order(graph: nx.DiGraph) -> list:
    if "order" in graph.graph:
        return list(graph.graph["order"])
    position = {v: i for i, v in enumerate(graph.nodes)}
    return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))


def _subsets(items):
    items = list(items)
    for r in range(len(items) + 1):
        yield from (frozenset(c) for c in itertools.combinations(items, r))


class _Stage:
    """One stage's ops on the timeline, from absolute times; `fails` once a rule is broken."""

    def __init__(self, graph, order, link, budget, state, clock, host_bytes):
        carried, _, _, host, retiring, d2h_rel, h2d_rel, off_rel, arr_rel = state
        self.graph, self.order, self.link, self.budget = graph, order, link, budget
        self.host_bytes = host_bytes
        self.retiring = set(retiring)  # retired, their last reload not yet waited for
        self.live = set(carried)
        self.clock = clock
        self.d2h_free, self.h2d_free = clock + d2h_rel, clock + h2d_rel
        self.off_end = {v: clock + r for v, r in off_rel}
        self.arrival = {v: clock + r for v, r in arr_rel}
        self.host = set(host)
        self.fails = False

    def mem(self, v):
        return self.graph.nodes[v]["mem"]

    def bytes_live(self):
        return sum(self.mem(v) for v in self.live)

    def wait(self, until):
        self.clock = max(self.clock, until)

    def waited_for(self, v):
        if v in self.retiring:
            self.retiring.discard(v)
            self.host.discard(v)

    def free(self, v):
        self.wait(self.off_end.get(v, 0))
        self.wait(self.arrival.pop(v, 0))
        self.waited_for(v)
        self.live.discard(v)

    def reload(self, v):
        bandwidth, latency, duplex = self.link[1], self.link[2][1], self.link[3]
        start = max(self.clock, self.h2d_free, self.off_end[v])
        if not duplex:
            start = max(start, self.d2h_free)
        self.h2d_free = start + latency + self.mem(v) / bandwidth
        if not duplex:
            self.d2h_free = self.h2d_free
        self.arrival[v] = self.h2d_free
        self.live.add(v)
        if self.bytes_live() > self.budget:
            self.fails = True

    def compute(self, v):
        if v in self.live or any(u not in self.live for u in self.graph.predecessors(v)):
            self.fails = True
            return
        for u in self.graph.predecessors(v):
            self.wait(self.arrival.pop(u, 0))  # later reads find the clock past it
            self.waited_for(u)
        self.clock += self.graph.nodes[v]["cost"]
        self.live.add(v)
        if self.bytes_live() + self.graph.nodes[v].get("transient", 0) > self.budget:
            self.fails = True

    def offload(self, v, host_memory):
        bandwidth, latency, duplex = self.link[0], self.link[2][0], self.link[3]
        start = max(self.clock, self.d2h_free)
        if not duplex:
            start = max(start, self.h2d_free)
        self.d2h_free = start + latency + self.mem(v) / bandwidth
        if not duplex:
            self.h2d_free = self.d2h_free
        self.off_end[v] = self.d2h_free
        self.host.add(v)
        held = sum(self.host_bytes(self.mem(u)) for u in self.host)
        if host_memory is not None and held > host_memory:
            self.fails = True


def offload_min_cost(
    graph: nx.DiGraph,
    budget: int,
    d2h: float,
    h2d: float,
    host_memory: int | None = None,
    host_bytes=lambda nbytes: nbytes,
    latency: tuple[float, float] = (0.0, 0.0),
    duplex: bool = True,
) -> float | None:
    """The least cost (compute plus stall) of a plan within `budget` device bytes and
    `host_memory` host bytes (a copy of mem bytes holding `host_bytes(mem)`), or None where
    none fits. `latency`: units each offload and each reload takes besides its bytes; `duplex`:
    one engine per direction, else one shared."""
    order = _order(graph)
    preds = {v: set(graph.predecessors(v)) for v in order}
    empty = (frozenset(),) * 5 + (0, 0, (), ())
    states = {empty: 0}
    for t, node in enumerate(order):
        last = t == len(order) - 1
        following = {}
        for state, clock in states.items():
            carried, host, retiring = state[0], state[3], state[4]
            earlier = [v for v in order[:t] if v not in carried]
            for recomputed in _subsets(earlier):
                stage = [v for v in order if v in recomputed] + [node]
                read = set().union(*(preds[v] for v in stage))
                reloadable = [v for v in earlier if v in host - retiring and v not in recomputed]
                for reloads in _subsets(reloadable):
                    live_after = carried | reloads | set(stage)
                    keeps = [frozenset()] if last else _subsets(o for o in order if o in live_after)
                    for keep in keeps:
                        if not reloads <= read | keep:
                            continue
                        for offload in (False, True) if graph.nodes[node]["mem"] else (False,):
                            retirable = [o for o in order if o in host - retiring]
                            for release in _releases(retirable, host_memory):
                                run = _run_stage(
                                    graph,
                                    order,
                                    (d2h, h2d, latency, duplex),
                                    budget,
                                    (host_memory, host_bytes),
                                    state,
                                    clock,
                                    (stage, reloads, keep, offload, release, read),
                                )
                                if run is None:
                                    continue
                                key, value = run
                                if value < following.get(key, math.inf):
                                    following[key] = value
        states = following
    ends = [clock + max(0, state[5], state[6]) for state, clock in states.items()]
    return min(ends, default=None)


def _releases(host, host_memory):
    """Host copies to retire after a stage's reloads (`host` in node order): none, or with a
    host limit any set."""
    if host_memory is None:
        yield frozenset()
    else:
        yield from _subsets(host)


def _run_stage(graph, order, link, budget, host, state, clock, choice):
    """The state after the stage `choice` describes and its clock, or None where it breaks a
    rule or the budgets. `host`: (host_memory, host_bytes)."""
    stage, reloads, keep, offload, release, read = choice
    host_memory, host_bytes = host
    carried, first, offloaded = state[:3]
    node = stage[-1]
    run = _Stage(graph, order, link, budget, state, clock, host_bytes)
    held = {v for v in carried if v in offloaded and v in first and v not in read | keep}
    for v in sorted(carried - read - keep - held, key=order.index):  # 1
        run.free(v)
    for v in sorted(reloads, key=order.index):  # 2
        run.reload(v)
    for v in release:  # held until the clock waits for a reload still unread
        if v in run.arrival:
            run.retiring.add(v)
        else:
            run.host.discard(v)
    last_read = {}
    for k in stage:
        last_read[k] = k
        for u in graph.predecessors(k):
            last_read[u] = k
    for k in stage:  # 3
        run.compute(k)
        if run.fails:
            return None
        if k == node and offload:
            run.offload(node, host_memory)
        for v in [*sorted(graph.predecessors(k), key=order.index), k]:
            if last_read.get(v) == k and v not in keep:
                run.free(v)
                last_read[v] = None
    for v in sorted(held, key=order.index):  # 4
        run.free(v)
    if run.fails:
        return None
    now = run.clock
    new_first = frozenset(v for v in first | {node} if v in keep)
    new_offloaded = offloaded | ({node} if offload else set())
    key = (
        frozenset(keep),
        new_first,
        frozenset(new_offloaded),
        frozenset(run.host),
        frozenset(run.retiring),
        max(0, run.d2h_free - now),
        max(0, run.h2d_free - now),
        tuple(sorted(((v, max(0, e - now)) for v, e in run.off_end.items()), key=repr)),
        tuple(
            sorted(((v, max(0, e - now)) for v, e in run.arrival.items() if v in keep), key=repr)
        ),
    )
    return key, now


def crossing_copies() -> nx.DiGraph:
    """0 -> 1 -> ... -> 5, 0 -> 3 and 2 -> 5; 0 and 2 are 4 B and cost 6 (each node else 1 B,
    cost 1), 2 and 4 have 4 B of workspace. At 9 B over a link of 2 B per unit each way, the
    optimum offloads 0 and 2 and reloads 0 at stage 3's start while 2's offload still runs:
    21 units over one engine per direction, 23 where both directions share one (the reload
    queues behind the offload)."""
    graph = nx.DiGraph()
    for v, cost in enumerate((6, 1, 6, 1, 1, 1)):
        big = v in (0, 2)
        graph.add_node(v, mem=4 if big else 1, cost=cost, transient=4 if v in (2, 4) else 0)
    graph.add_edges_from([(i, i + 1) for i in range(5)] + [(0, 3), (2, 5)])
    return graph
