"""Plans from lifetimes (solver.core.stages) and the lifetime search
(solver.heuristics.lifetimes): every assignment gives a valid plan, the search's fast evaluation
agrees with the plan's expansion, checkpoint policies are assignments, and the search returns a
schedule within its budget that the simulator accepts, never below the exhaustive optimum."""

from __future__ import annotations

import gc

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import repeated_training_graphs, small_graphs, training_graphs

import solver
from solver.core.stages import (
    LAST,
    Lifetimes,
    checkpoint_all,
    plan_from_keep,
    plan_from_lifetimes,
    plan_to_ops,
)
from solver.deadline import Deadline
from solver.examples import uniform_training_chain
from solver.heuristics.lifetime_moves import apply_move, longer_moves
from solver.heuristics.lifetimes import (
    _evaluate,
    lifetime_search,
    longest,
    start_from_member,
    start_from_plan,
)


@st.composite
def graphs_with_lifetimes(draw) -> tuple[nx.DiGraph, Lifetimes]:
    graph = draw(st.one_of(small_graphs(max_nodes=7), training_graphs(forward_nodes=3)))
    n = graph.number_of_nodes()
    end = tuple(draw(st.integers(min_value=v, max_value=n - 1)) for v in range(n))
    retain = tuple(draw(st.integers(min_value=0, max_value=LAST)) for _ in range(n))
    return graph, Lifetimes(end, retain)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(graphs_with_lifetimes())
def test_every_assignment_is_a_valid_plan_and_the_fast_evaluation_agrees(case):
    graph, lifetimes = case
    problem = solver.prepare(graph)
    schedule = plan_to_ops(problem, plan_from_lifetimes(problem, lifetimes))
    replay = solver.simulate(graph, [(kind, problem.ids[i]) for kind, i in schedule.ops])
    replay.raise_if_invalid()
    assert replay.peak == schedule.peak
    fast = _evaluate(problem, lifetimes)
    assert fast.stage_peaks == schedule.stage_peaks
    assert abs(fast.cost - schedule.cost) <= 1e-9 * max(1.0, schedule.cost)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(graphs_with_lifetimes())
def test_a_longer_life_changes_no_computation_of_a_value_never_recomputed(case):
    """What lets the improvement skip such values: no stage lacks a copy of them, so letting
    them live longer recomputes exactly the same nodes."""
    graph, lifetimes = case
    problem = solver.prepare(graph)
    current = _evaluate(problem, lifetimes)
    computed = plan_from_lifetimes(problem, lifetimes).computed
    for v in range(problem.n):
        if len(current.windows[v]) < 2:
            for move in longer_moves(problem, lifetimes, v):
                longer = apply_move(problem, lifetimes, move, None)
                assert plan_from_lifetimes(problem, longer).computed == computed


def test_checkpoint_all_is_the_longest_assignment():
    graph = nx.DiGraph([(0, 1), (1, 2), (0, 2), (2, 3)])
    for v, mem in enumerate([3, 1, 2, 1]):
        graph.nodes[v].update(mem=mem, cost=1)
    problem = solver.prepare(graph)
    assert plan_from_lifetimes(problem, longest(problem)) == plan_from_keep(problem, range(4))
    assert plan_to_ops(problem, plan_from_keep(problem, range(4))) == checkpoint_all(problem)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.one_of(small_graphs(max_nodes=6), training_graphs(forward_nodes=3)))
def test_the_search_fits_its_budget_and_never_beats_the_exhaustive_optimum(graph):
    _check_the_search(graph, with_empty_policy=True)


# 8 nodes: the exhaustive frontier takes about 3 s each
@settings(max_examples=6, deadline=None, derandomize=True)
@given(repeated_training_graphs(blocks=3, block_nodes=1))
def test_the_search_with_moves_in_every_block_never_beats_the_exhaustive_optimum(graph):
    _check_the_search(graph, with_empty_policy=False)


def _check_the_search(graph: nx.DiGraph, *, with_empty_policy: bool) -> None:
    """At every frontier budget below checkpoint-all's peak, the search from checkpoint-all (and
    the keep-nothing policy) returns a plan the simulator accepts within the budget, never
    cheaper than the exhaustive optimum (it stops once it reaches it), carrying the lifetimes
    it came from."""
    problem = solver.prepare(graph)
    frontier = stage_space_frontier(graph)
    top = checkpoint_all(problem).peak
    starts = [longest(problem)]
    if with_empty_policy:
        starts.append(start_from_plan(problem, plan_from_keep(problem, [])))
    for budget in sorted({peak for _, peak in frontier} | {problem.memory_lower_bound}):
        if budget >= top:
            continue
        optimum = min_cost_within(frontier, budget)
        assert optimum is not None
        found = lifetime_search(
            problem,
            budget,
            starts,
            deadline=Deadline.after(0.2),
            enough=lambda member: member.schedule.cost <= optimum + 1e-9,  # noqa: B023
        )
        if found is None:
            continue
        schedule = found.schedule
        replay = solver.simulate(graph, [(kind, problem.ids[i]) for kind, i in schedule.ops])
        replay.raise_if_invalid()
        assert replay.peak == schedule.peak <= budget
        assert schedule.cost >= optimum - 1e-9
        # the plan carries the lifetimes it came from, and a search resumes from them
        assert found.lifetimes is not None
        assert plan_from_lifetimes(problem, found.lifetimes) == found.plan
        assert start_from_member(problem, found) == found.lifetimes


def test_the_search_pauses_the_collector_and_leaves_it_as_it_was():
    problem = solver.prepare(uniform_training_chain(6))
    budget = checkpoint_all(problem).peak - 1
    inside = []
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            lifetime_search(
                problem,
                budget,
                [longest(problem)],
                deadline=Deadline.after(0.05),
                found=lambda _: inside.append(gc.isenabled()),
            )
            assert gc.isenabled() == enabled
        finally:
            gc.enable()
    assert inside and not any(inside)
