"""The peak floor (`solver.core.peak_floor`): never above the least peak of any op sequence,
and above the one-line bound where the input computed last was computed beside the others."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from solver_reference import general_space_min_cost
from solver_strategies import small_graphs

import solver


def least_general_peak(graph: nx.DiGraph, low: int, high: int) -> int:
    """The least budget some op sequence fits (bisection over the Dijkstra reference)."""
    while low < high:
        middle = (low + high) // 2
        if general_space_min_cost(graph, middle) is None:
            low = middle + 1
        else:
            high = middle
    return low


def one_line(problem: solver.Problem) -> int:
    return max(problem.compute_floor(v) for v in range(problem.n))


def diamond() -> nx.DiGraph:
    """0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3: node 3 needs 1 and 2 (16 B with its own 2 B), but
    whichever of 1 and 2 comes last is computed beside the other and its input 0: 19 B."""
    graph = nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 3)])
    for v, mem in enumerate([5, 7, 7, 2]):
        graph.nodes[v].update(mem=mem, cost=1)
    return graph


def test_the_diamond_floor_is_its_least_peak_and_refuses_the_bytes_under_it():
    graph = diamond()
    problem = solver.prepare(graph)
    assert one_line(problem) == 16
    assert problem.memory_lower_bound == 19 == least_general_peak(graph, 16, 24)
    least = solver.solve(graph, objective="memory", time_limit=10)
    assert least.status == "OPTIMAL" and least.peak == 19
    with pytest.raises(solver.InfeasibleBudgetError) as refused:
        solver.solve(graph, 18, time_limit=10)
    assert refused.value.lower_bound_bytes == 19


@settings(max_examples=150, deadline=None)
@given(small_graphs(max_nodes=6))
def test_the_floor_is_never_above_the_least_peak_of_any_op_sequence(graph):
    problem = solver.prepare(graph)
    floor = problem.memory_lower_bound
    assert floor >= one_line(problem)
    high = solver.checkpoint_all_peak(problem)
    assert floor <= least_general_peak(graph, one_line(problem), high)
