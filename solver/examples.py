"""Built-in example graphs: the training graph of a forward DAG, chains and a residual demo.

`training_graph` turns a forward DAG into the forward+backward DAG that reverse-mode autodiff
runs: for each forward node v a gradient node d(v) that reads the gradients of v's users and the
values v's derivative needs (v's inputs and v itself). The last forward node is the loss.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import networkx as nx


def training_graph(
    forward: nx.DiGraph, grad_mem: dict | None = None, grad_cost: dict | None = None
) -> nx.DiGraph:
    """The forward+backward graph of `forward` (nodes need `mem` and `cost`).

    Forward node v keeps its id; its gradient node is the string f"d{v}" (ids stay JSON
    scalars). Gradient bytes default to the forward node's bytes and
    gradient cost to twice the forward cost (the usual backward/forward FLOP ratio).
    """
    order = list(nx.topological_sort(forward))
    graph = nx.DiGraph()
    for v in order:
        graph.add_node(
            v, mem=forward.nodes[v]["mem"], cost=forward.nodes[v]["cost"], phase="forward"
        )
    grads = {v: f"d{v}" for v in order}
    for v in reversed(order):
        mem = grad_mem[v] if grad_mem else forward.nodes[v]["mem"]
        cost = grad_cost[v] if grad_cost else 2 * forward.nodes[v]["cost"]
        graph.add_node(grads[v], mem=mem, cost=cost, phase="backward")
    graph.add_edges_from(forward.edges)
    for v in order:
        for w in forward.successors(v):
            graph.add_edge(grads[w], grads[v])
        for u in (*forward.predecessors(v), v):
            graph.add_edge(u, grads[v])
    graph.graph["order"] = order + [grads[v] for v in reversed(order)]
    return graph


def chain(mems: Sequence[int], costs: Sequence[float]) -> nx.DiGraph:
    """A forward chain 0 -> 1 -> ... with the given bytes and costs per node."""
    graph = nx.DiGraph()
    for i, (m, c) in enumerate(zip(mems, costs, strict=True)):
        graph.add_node(i, mem=m, cost=c)
        if i:
            graph.add_edge(i - 1, i)
    return graph


def uniform_training_chain(n: int, mem: int = 1, cost: float = 1) -> nx.DiGraph:
    """Training graph of a uniform chain of n blocks (one unit of bytes and cost each)."""
    return training_graph(chain([mem] * n, [cost] * n))


def residual_demo(blocks: int = 3) -> nx.DiGraph:
    """A small ResNet-shaped training graph with heterogeneous bytes and costs (the CLI demo).

    Each block: conv (expensive, large output) -> relu (cheap, large) -> conv -> add (skip);
    every second block halves the spatial size (bytes / 2) and doubles the channels.
    """
    forward = nx.DiGraph()
    size, flops = 8 * 2**20, 4.0
    previous = "stem"
    forward.add_node(previous, mem=size, cost=flops)
    for b in range(blocks):
        names = [f"b{b}.conv1", f"b{b}.relu", f"b{b}.conv2", f"b{b}.add"]
        costs = [flops, 0.1, flops, 0.1]
        for name, c in zip(names, costs, strict=True):
            forward.add_node(name, mem=size, cost=c)
        forward.add_edges_from(
            [(previous, names[0]), *itertools.pairwise(names), (previous, names[3])]
        )
        previous = names[3]
        if b % 2 == 1:
            size //= 2
    forward.add_node("pool", mem=4096, cost=0.1)
    forward.add_node("loss", mem=4, cost=0.1)
    forward.add_edges_from([(previous, "pool"), ("pool", "loss")])
    graph = training_graph(forward)
    graph.graph["name"] = "residual_demo"
    return graph
