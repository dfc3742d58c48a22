"""The scope of "OPTIMAL": proven over the stage schedules in the graph's node order, which
another order of first computes can beat (`python -m benchmarks.solving.stage_scope` measures how
often)."""

from __future__ import annotations

import networkx as nx
from solver_reference import general_space_min_cost, min_cost_within, stage_space_frontier

import solver


def two_branches(order: list[str]) -> nx.DiGraph:
    """a -> a2 and b -> b2, a and b 3 bytes, a2 and b2 1 byte, every cost 1."""
    graph = nx.DiGraph()
    graph.add_nodes_from(["a", "b"], mem=3, cost=1)
    graph.add_nodes_from(["a2", "b2"], mem=1, cost=1)
    graph.add_edges_from([("a", "a2"), ("b", "b2")])
    graph.graph["order"] = order
    return graph


def test_optimal_holds_in_the_node_order_and_another_order_can_be_cheaper():
    # In the order a, b, a2, b2 at 5 bytes, a and b are never live together (6 bytes): both are
    # computed twice. Computing a2 before b needs no recomputation.
    interleaved = two_branches(["a", "b", "a2", "b2"])
    schedule = solver.solve(interleaved, 5, time_limit=10)
    assert schedule.status == "OPTIMAL" and schedule.cost == 6
    assert min_cost_within(stage_space_frontier(interleaved), 5) == 6
    assert general_space_min_cost(interleaved, 5) == 4  # every op sequence: a, a2, b, b2
    assert general_space_min_cost(interleaved, 5, ["a", "b", "a2", "b2"]) == 6
    branch_by_branch = two_branches(["a", "a2", "b", "b2"])
    assert solver.solve(branch_by_branch, 5, time_limit=10).cost == 4
