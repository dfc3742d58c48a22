"""The eviction heuristic (solver.heuristics.eviction), by distance or guided by an LP's keep
fractions: its schedules are valid and within their budget, and it fits where the checkpoint
policies cannot. The least-peak search over it and the backward search:
tests/test_solver_warm_start.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_checks import RANDOM_250, check_within
from solver_strategies import small_graphs

import solver
from solver.core.stages import cheapest_within, checkpoint_all
from solver.examples import residual_demo
from solver.heuristics.baselines import BASELINES
from solver.heuristics.eviction import evict_by_keep, evict_within
from solver.io import load_graph


def _budget(problem, where: float) -> int:
    """A budget `where` of the way from the one-line bound to the checkpoint-all peak."""
    low, high = problem.memory_lower_bound, checkpoint_all(problem).peak
    return round(low + where * (high - low))


@settings(max_examples=60)
@given(small_graphs(max_nodes=8), st.floats(min_value=0.0, max_value=1.0))
def test_an_eviction_run_fits_its_budget(graph, where):
    problem = solver.prepare(graph)
    budget = _budget(problem, where)
    check_within(graph, problem, budget, evict_within(problem, budget))


@settings(max_examples=60)
@given(small_graphs(max_nodes=8), st.floats(min_value=0.0, max_value=1.0), st.randoms())
def test_an_lp_guided_eviction_run_fits_its_budget(graph, where, rng):
    """Whatever the keep fractions (an LP's or not), the run fits or fails."""
    problem = solver.prepare(graph)
    budget = _budget(problem, where)
    fractions = [{i: rng.random() for i in range(t)} for t in range(problem.n + 1)]
    check_within(graph, problem, budget, evict_by_keep(problem, budget, fractions))


@settings(max_examples=30)
@given(small_graphs(max_nodes=8))
def test_at_the_checkpoint_all_peak_nothing_is_evicted(graph):
    problem = solver.prepare(graph)
    member = evict_within(problem, checkpoint_all(problem).peak)
    assert member is not None
    assert member.schedule.cost == problem.total_cost


def test_eviction_fits_random_layered_where_no_policy_does():
    """random_layered n=250 at 90%: the best checkpoint policy recomputes at each use (over 10x
    the eviction run's cost), the eviction run is within 2% of computing every node once."""
    if not RANDOM_250.exists():
        pytest.skip(f"{RANDOM_250} not present")
    problem = solver.prepare(load_graph(RANDOM_250))
    budget = solver.parse_budget("90%", problem)
    member = evict_within(problem, budget)
    assert member is not None and member.schedule.peak <= budget
    assert member.schedule.cost <= 1.02 * problem.total_cost
    policies = [m for family in BASELINES.values() for m in family(problem)]
    best_policy = cheapest_within(policies, budget)
    assert best_policy is None or best_policy.schedule.cost > 10 * member.schedule.cost


def test_evict_is_a_schedule_like_the_baselines():
    graph = residual_demo(blocks=2)
    schedule = solver.evict(graph, "80%")
    assert schedule is not None and schedule.method == "eviction"
    assert schedule.peak <= schedule.budget == solver.parse_budget("80%", solver.prepare(graph))
    assert solver.simulate(graph, schedule.ops).valid
