"""The exact solver against independent references, baselines and its other objective."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_checks import lp_bound, probes_reach_the_optimum
from solver_reference import general_space_min_cost, min_cost_within, stage_space_frontier
from solver_strategies import small_graphs, training_graphs

import solver
from solver import SolveOptions
from solver.core.stages import cheapest_within
from solver.deadline import Deadline
from solver.exact.probes import _weak_on_op_level
from solver.exact.state import Goal, Search
from solver.examples import uniform_training_chain
from solver.heuristics.baselines import BASELINES
from solver.milp.units import CostUnits

TIME_LIMIT = 30.0


def _budgets(graph) -> list[int]:
    problem = solver.prepare(graph)
    top = solver.checkpoint_all_peak(problem)
    return sorted(
        {
            max(0, problem.memory_lower_bound - 1),
            problem.memory_lower_bound,
            (problem.memory_lower_bound + top) // 2,
            top - 1,
            top,
        }
    )


@settings(max_examples=40)
@given(small_graphs(max_nodes=6))
def test_exact_cost_equals_exhaustive_stage_search(graph):
    frontier = stage_space_frontier(graph)
    for budget in _budgets(graph):
        expected = min_cost_within(frontier, budget)
        try:
            schedule = solver.solve(graph, budget, time_limit=TIME_LIMIT)
        except solver.InfeasibleBudgetError as exc:
            assert expected is None, f"solver says infeasible, reference found cost {expected}"
            assert exc.minimum_bytes == min(p for _, p in frontier)
            continue
        assert schedule.status == "OPTIMAL"
        assert schedule.cost == pytest.approx(expected)
        check = solver.simulate(graph, schedule.ops)
        assert check.valid and check.peak == schedule.peak <= budget
        assert check.cost == pytest.approx(schedule.cost)
        general = general_space_min_cost(graph, budget)
        assert general is not None and general <= schedule.cost + 1e-9


def test_probes_reach_the_exhaustive_optimum_from_a_poor_incumbent():
    """Both probe engines (HiGHS's climbing caps, CP-SAT's run from the incumbent), each forced
    to close the whole gap from a bound of 0 and the worst heuristic incumbent, reach the
    exhaustive optimum."""
    statuses: dict[str, list[str]] = {"highs": [], "cpsat": []}

    @settings(max_examples=6)
    @given(training_graphs(forward_nodes=4))
    def check(graph):
        for v in graph.nodes:  # free recomputes would make the worst incumbent optimal
            graph.nodes[v]["cost"] += 1
        probes_reach_the_optimum(graph, _budgets(graph), statuses)

    check()
    # HiGHS climbs (refuted caps, then the optimum found under a cap); CP-SAT's one run from the
    # incumbent finds and proves the optimum.
    assert "INFEASIBLE" in statuses["highs"] and "OPTIMAL" in statuses["highs"]
    assert "OPTIMAL" in statuses["cpsat"]


def test_cpsat_shares_its_time_only_where_the_lp_is_weak_on_an_op_level_graph():
    """CP-SAT's run from the incumbent leaves time to the lifetime polish exactly where the
    stage model's LP is under the floor and the lifetime search has run
    (`TimeShares.minimise`)."""
    graph = uniform_training_chain(4)
    problem = solver.prepare(graph)
    goal = Goal("cost", CostUnits.of(problem))
    search = Search(graph, problem, goal, SolveOptions(), 1, Deadline.after(10), 10.0, 0.0)
    assert not _weak_on_op_level(search)  # no LP
    search.lp = lp_bound(2, 0)
    search.floor = 3
    assert not _weak_on_op_level(search)  # the lifetime search has not run: a published graph
    search.lifetime_best = math.inf
    assert _weak_on_op_level(search)
    search.lp = lp_bound(3, 0)
    assert not _weak_on_op_level(search)  # the LP is as strong as the floor


@settings(max_examples=25)
@given(small_graphs(max_nodes=6))
def test_exact_is_never_worse_than_any_baseline(graph):
    problem = solver.prepare(graph)
    for budget in _budgets(graph):
        try:
            schedule = solver.solve(graph, budget, time_limit=TIME_LIMIT)
        except solver.InfeasibleBudgetError:
            continue
        for name, family in BASELINES.items():
            best = cheapest_within(family(problem), budget)
            if best is not None:
                assert schedule.cost <= best.schedule.cost + 1e-9, name
                assert solver.simulate(graph, solver.baseline(graph, name, budget).ops).valid


@settings(max_examples=25)
@given(small_graphs(max_nodes=6), st.floats(min_value=1.0, max_value=2.5))
def test_memory_objective_matches_exhaustive_search_and_cost_objective(graph, ratio):
    problem = solver.prepare(graph)
    limit = problem.total_cost * ratio
    frontier = stage_space_frontier(graph)
    least_peak = min(p for c, p in frontier if c <= limit + 1e-9)
    schedule = solver.solve(
        graph, objective="memory", compute_budget=f"{limit!r}units", time_limit=TIME_LIMIT
    )
    assert schedule.status == "OPTIMAL"
    assert schedule.peak == least_peak
    assert schedule.cost <= limit + 1e-9
    # At the frontier the two objectives agree: the least cost within that peak is affordable.
    by_cost = solver.solve(graph, schedule.peak, time_limit=TIME_LIMIT)
    assert by_cost.cost <= schedule.cost + 1e-9
    assert by_cost.cost == pytest.approx(min_cost_within(frontier, schedule.peak))


@pytest.mark.parametrize("n", [9, 16])
def test_sqrt_segments_peak_follows_k_plus_n_over_k_and_exact_is_cheaper(n):
    graph = uniform_training_chain(n)
    problem = solver.prepare(graph)
    k = round(math.sqrt(n))
    sqrt_schedule = solver.baseline(graph, "sqrt_segments")
    # n/k checkpoints plus one live segment of k values, with the gradient pair of a block.
    assert k + n / k <= sqrt_schedule.peak <= k + n / k + 1
    # One extra forward pass, less the checkpoints that are not recomputed.
    assert sqrt_schedule.cost - problem.total_cost == n - n // k
    exact = solver.solve(graph, 2 * k, time_limit=TIME_LIMIT)
    assert exact.status == "OPTIMAL"
    assert exact.peak <= 2 * k
    assert exact.cost <= sqrt_schedule.cost


def test_every_k_on_48_blocks_reproduces_the_seed_numbers():
    graph = uniform_training_chain(48)
    problem = solver.prepare(graph)
    from solver.heuristics.baselines import _keep_every, candidates

    peaks = {k: _keep_every(problem, candidates(problem), k).schedule.peak for k in (4, 7)}
    assert peaks == {4: 16, 7: 14}  # k + n/k units: 4 + 12, 7 + 48/7 ~ 13.9
