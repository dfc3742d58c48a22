"""Hypothesis strategies for solver tests: small DAGs of the shapes networks have."""

from __future__ import annotations

import networkx as nx
from hypothesis import strategies as st

from solver.examples import chain, training_graph

mems = st.integers(min_value=0, max_value=8)
costs = st.integers(min_value=0, max_value=5)
transients = st.one_of(st.none(), st.integers(min_value=0, max_value=6))
"""A node's transient bytes: absent (0) about half the time."""
modules = st.one_of(st.none(), st.sampled_from(["", "a", "a.0", "a.0.x", "a.1", "a.1.x", "b"]))
"""A node's module path: absent about half the time; blocks a.0, a.1 and b at depth 1-2."""


def _attach(graph: nx.DiGraph, draw) -> nx.DiGraph:
    for v in graph.nodes:
        graph.nodes[v]["mem"] = draw(mems)
        graph.nodes[v]["cost"] = draw(costs)
        transient = draw(transients)
        if transient is None:
            graph.nodes[v].pop("transient", None)
        else:
            graph.nodes[v]["transient"] = transient
        module = draw(modules)
        if module is None:
            graph.nodes[v].pop("module", None)
        else:
            graph.nodes[v]["module"] = module
    return graph


@st.composite
def forward_dags(draw, max_nodes: int = 5, min_nodes: int = 2) -> nx.DiGraph:
    """Chains, diamonds, skip connections and random DAGs (edges only go forward)."""
    n = draw(st.integers(min_value=min_nodes, max_value=max_nodes))
    shape = draw(st.sampled_from(["chain", "diamond", "skip", "random"]))
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((i, i + 1) for i in range(n - 1))
    if shape == "diamond" and n >= 4:
        graph.remove_edge(1, 2)
        graph.add_edges_from([(0, 2), (1, 3)])
    elif shape == "skip":
        for i in range(n - 2):
            if draw(st.booleans()):
                graph.add_edge(i, i + 2)
    elif shape == "random":
        for i in range(n):
            for j in range(i + 2, n):
                if draw(st.booleans()):
                    graph.add_edge(i, j)
    return _attach(graph, draw)


@st.composite
def small_graphs(draw, max_nodes: int = 6) -> nx.DiGraph:
    """Forward DAGs of up to max_nodes nodes, or training graphs (forward + backward) of up to
    max_nodes // 2 forward nodes."""
    if draw(st.booleans()):
        return draw(forward_dags(max_nodes))
    forward = draw(forward_dags(max_nodes // 2))
    return _attach(training_graph(forward), draw)


@st.composite
def training_graphs(draw, forward_nodes: int) -> nx.DiGraph:
    """Training graphs (forward + backward) of exactly forward_nodes forward nodes."""
    forward = draw(forward_dags(forward_nodes, min_nodes=forward_nodes))
    return _attach(training_graph(forward), draw)


def uniform_chain(n: int) -> nx.DiGraph:
    """A forward chain of n unit nodes."""
    return chain([1] * n, [1] * n)


@st.composite
def repeated_training_graphs(draw, blocks: int = 3, block_nodes: int = 3) -> nx.DiGraph:
    """Training graphs of a stem node and `blocks` copies of one drawn block of up to
    `block_nodes` nodes (the first reads the previous copy's last node), each copy's nodes,
    backward ones included, under the module path `layers.<k>.f`: the repeated blocks
    `solver.core.repeats` groups. The copies' costs differ by up to 1, as measured times do."""
    # node 0 is the block's source, the last its sink
    block = draw(forward_dags(block_nodes, min_nodes=min(2, block_nodes)))
    forward = nx.DiGraph()
    forward.add_node("in", mem=draw(mems), cost=draw(costs))
    previous = "in"
    for k in range(blocks):
        for v in block.nodes:
            extra = draw(st.integers(min_value=0, max_value=1))
            forward.add_node(
                f"b{k}n{v}", mem=block.nodes[v]["mem"], cost=block.nodes[v]["cost"] + extra
            )
        forward.add_edges_from((f"b{k}n{u}", f"b{k}n{v}") for u, v in block.edges)
        forward.add_edge(previous, f"b{k}n0")
        previous = f"b{k}n{max(block.nodes)}"
    graph = training_graph(forward)
    for v in forward.nodes:
        if v != "in":
            path = f"layers.{v[1 : v.index('n')]}.f"
            graph.nodes[v]["module"] = graph.nodes[f"d{v}"]["module"] = path
    return graph
