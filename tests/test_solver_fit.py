"""`solver.fitting.search.largest_fitting` against an exhaustive reference: the largest size
whose least peak within a compute cap fits a memory, on small graphs with bytes affine in the
size."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_reference import stage_space_frontier
from solver_strategies import small_graphs

import solver
from solver.core.budget import parse_compute_budget
from solver.core.graph import prepare
from solver.examples import chain, training_graph
from solver.fitting.search import largest_fitting
from solver.fitting.sizes import DOES_NOT_FIT, FITS

HIGH = 12
"""The largest size tried; a graph whose bytes do not grow fits every size up to it."""


def at_size(graph: nx.DiGraph, slopes: dict, size: int) -> nx.DiGraph:
    """The graph with each node's `mem` = its base bytes + slope * size."""
    scaled = graph.copy()
    for v, attrs in scaled.nodes(data=True):
        attrs["mem"] = graph.nodes[v]["mem"] + slopes[v] * size
    return scaled


def reference_largest(graph, slopes, memory, cap) -> int | None:
    """The largest size in [1, HIGH] whose least stage-space peak within the cap is at most
    `memory` bytes, by enumerating every stage plan at every size."""
    best = None
    for size in range(1, HIGH + 1):
        scaled = at_size(graph, slopes, size)
        limit = None if cap is None else parse_compute_budget(cap, prepare(scaled))
        peaks = [p for c, p in stage_space_frontier(scaled) if limit is None or c <= limit + 1e-9]
        if peaks and min(peaks) <= memory:
            best = size
    return best


@st.composite
def affine_cases(draw):
    graph = draw(small_graphs(max_nodes=5))
    slopes = {v: draw(st.integers(min_value=0, max_value=3)) for v in graph.nodes}
    memory = draw(st.integers(min_value=0, max_value=60))
    cap = draw(st.sampled_from([None, "1.0x", "1.5x"]))
    return graph, slopes, memory, cap


@settings(max_examples=25, deadline=None)
@given(affine_cases())
def test_largest_fitting_equals_the_exhaustive_largest_size(case):
    graph, slopes, memory, cap = case
    fit = largest_fitting(
        lambda s: at_size(graph, slopes, s), memory, compute_budget=cap, high=HIGH, time_limit=30
    )
    assert fit.size == reference_largest(graph, slopes, memory, cap)
    verdicts = {p.size: p.verdict for p in fit.probes}
    if fit.size is not None:
        assert verdicts[fit.size] == FITS and fit.schedule is not None
        assert fit.schedule.peak <= memory
    if fit.upper is not None:  # the proof at size + 1 (or at the first size, where none fits)
        assert fit.proven and verdicts[fit.upper] == DOES_NOT_FIT
        assert fit.upper == (1 if fit.size is None else fit.size + 1)
    else:
        assert fit.size == HIGH


def test_the_proof_at_size_plus_one_is_a_bound_above_the_memory():
    """A chain whose every node grows by one byte per size: the next size's least peak is
    proven above the memory, not merely not found under it."""
    graph = nx.DiGraph([(0, 1), (1, 2), (2, 3)])
    for v in graph.nodes:
        graph.nodes[v].update(mem=0, cost=1)
    slopes = dict.fromkeys(graph.nodes, 1)
    fit = largest_fitting(lambda s: at_size(graph, slopes, s), 7, time_limit=30)
    assert (fit.size, fit.upper, fit.proven) == (3, 4, True)  # two live values of s bytes
    next_size = next(p for p in fit.probes if p.size == 4)
    assert next_size.verdict == DOES_NOT_FIT and next_size.bound > 7


def test_bytes_that_fall_with_the_size_are_refused():
    graph = nx.DiGraph([(0, 1)])
    graph.add_nodes_from([0, 1], cost=1)

    def falling(size):
        scaled = graph.copy()
        nx.set_node_attributes(scaled, {0: 100 - size, 1: 1}, "mem")
        return scaled

    with pytest.raises(ValueError, match="falls"):
        largest_fitting(falling, 1000, high=8, time_limit=10)


def test_a_timeout_carries_the_proven_cost_floor():
    """With no step run after `begin`, nothing within a budget under checkpoint-all is found:
    the error's cost bound is the floor proven so far, computing every node once."""
    graph = training_graph(chain([4, 4, 4, 4], [1, 2, 3, 4]))
    problem = prepare(graph)
    budget = solver.checkpoint_all_peak(problem) - 1
    with pytest.raises(solver.SolverTimeoutError) as caught:
        solver.solve(graph, budget, time_limit=5, options=solver.SolveOptions(steps=()))
    assert caught.value.cost_bound == problem.total_cost
