"""The moment relaxation (`formulation.build(..., moment_stages=...)`) and the solver phase that
uses it, checked against the exhaustive stage-space search of `solver_reference`."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_checks import NO_COVER, RANDOM_250
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import small_graphs, training_graphs

import solver
from solver import SolveOptions
from solver.core.stages import checkpoint_all, complete_prefix, plan_to_ops
from solver.deadline import Deadline
from solver.examples import chain, training_graph
from solver.io import load_graph
from solver.milp.cpsat import CpSatModel
from solver.milp.formulation import build
from solver.milp.plans import plan_from_values
from solver.milp.units import CostUnits


def _tight_budgets(problem) -> list[int]:
    """Budgets below the checkpoint-all peak that some schedule may meet."""
    top = solver.checkpoint_all_peak(problem)
    low = problem.memory_lower_bound
    budgets = (low, (3 * low + top) // 4, (low + top) // 2, top - 1)
    return sorted({b for b in budgets if low <= b < top})


def _moment_memories(problem) -> list[int]:
    """Bytes live while checkpoint-all computes each node (its transient bytes included), read
    off its ops."""
    live, at = 0, []
    for kind, v in checkpoint_all(problem).ops:
        live += problem.mem[v] if kind == "compute" else -problem.mem[v]
        if kind == "compute":
            at.append(live + problem.transient[v])
    return at


def _first_tight_stage(problem, budget: int) -> int:
    """The first stage over the budget in checkpoint-all, as `solver.exact` finds it."""
    return min(t for t, peak in enumerate(checkpoint_all(problem).stage_peaks) if peak > budget)


@settings(max_examples=40)
@given(small_graphs(max_nodes=6))
def test_checkpoint_all_stage_peaks_are_the_bytes_live_at_each_node(graph):
    """Its stage peaks, which `solver.exact` reads the first stage over a budget from, are the
    bytes live when each node is computed, read off its ops."""
    problem = solver.prepare(graph)
    assert list(checkpoint_all(problem).stage_peaks) == _moment_memories(problem)


@settings(max_examples=8)
@given(st.one_of(small_graphs(max_nodes=6), training_graphs(forward_nodes=4)))
def test_moment_relaxation_bounds_the_optimum_and_its_fitting_plans_are_optimal(graph):
    """From stage 0 and from the first tight stage: the relaxation's optimum is at most the
    exhaustive optimum (infeasible only when no schedule fits), and when its plan, completed
    without recomputation before the first stage, fits the budget it is an optimal schedule."""
    problem = solver.prepare(graph)
    int_cost = CostUnits.of(problem).int_cost
    frontier = stage_space_frontier(graph)
    for budget in _tight_budgets(problem):
        expected = min_cost_within(frontier, budget)
        for first in {0, _first_tight_stage(problem, budget)}:
            stages = range(first, problem.n)
            lm = build(problem, budget, int_cost, first_stage=first, moment_stages=stages)
            result = CpSatModel(lm).solve(deadline=Deadline.after(30), workers=8)
            if result.status == "INFEASIBLE":
                assert expected is None
                continue
            assert result.status == "OPTIMAL"
            if expected is not None:
                assert result.objective <= expected - sum(int_cost)
            plan = plan_from_values(lm, problem.n, result.values.__getitem__)
            schedule = plan_to_ops(problem, complete_prefix(problem, plan, first))
            check = solver.simulate(graph, [(kind, problem.ids[v]) for kind, v in schedule.ops])
            assert check.valid and check.cost == schedule.cost
            assert schedule.cost - sum(int_cost) == result.objective
            if schedule.peak <= budget:
                assert schedule.cost == expected


@settings(max_examples=8)
@given(st.one_of(small_graphs(max_nodes=6), training_graphs(forward_nodes=4)))
def test_solving_through_the_moment_phase_reaches_the_exhaustive_optimum(graph):
    """With the phase forced on every graph, the solver's answer is the exhaustive optimum: a
    relaxation plan that does not fit leaves the rest to the stage model, with its bound."""
    frontier = stage_space_frontier(graph)
    problem = solver.prepare(graph)
    forced = SolveOptions(moment_late_share=0.0, moment_max_variables=10**9)
    for budget in _tight_budgets(problem):
        expected = min_cost_within(frontier, budget)
        try:
            schedule = solver.solve(graph, budget, time_limit=30, options=forced)
        except solver.InfeasibleBudgetError:
            assert expected is None
            continue
        assert schedule.status == "OPTIMAL"
        assert schedule.cost == pytest.approx(expected)
        assert solver.simulate(graph, schedule.ops).peak <= budget


def test_after_a_weak_lp_the_moment_phase_runs_and_the_answer_is_the_exhaustive_optimum():
    """A training graph whose first overflow is at stage 4 of 8, under options that run the
    relaxation first only past 60% of the stages: it runs after the stage model's LP, which is
    weak there (the CP-SAT path, `solver.exact.probes`), and the answer is still the exhaustive
    optimum."""
    graph = training_graph(chain([3, 9, 2, 7], [1, 2, 3, 1]))
    budget = 24
    expected = min_cost_within(stage_space_frontier(graph), budget)
    options = replace(NO_COVER, moment_late_share=0.6)
    schedule = solver.solve(graph, budget, time_limit=30, options=options)
    records = {record["step"]: record for record in schedule.extra["steps"]}
    assert "moment_rounds" not in records["moment_relaxation"]
    assert records["probes"]["moment_rounds"][0]["first_stage"] == 4
    assert schedule.status == "OPTIMAL" and schedule.cost == pytest.approx(expected)
    assert solver.simulate(graph, schedule.ops).peak <= budget


@pytest.mark.long
def test_random_layered_250_at_90_percent_is_proven_through_the_moment_phase():
    """Issue 6's random_layered n=250 row: first tight stage 213 of 250, where the relaxation
    (17k variables) is small beside the stage model (190k) and its optimal plan fits: the proof
    (`python -m benchmarks.solving.solver_scale --rows random250` times it)."""
    if not RANDOM_250.exists():
        pytest.skip(f"{RANDOM_250} not present")
    graph = load_graph(RANDOM_250)
    schedule = solver.solve(graph, "90%", time_limit=240)
    assert schedule.status == "OPTIMAL"
    assert schedule.cost == 126704  # 1135 above computing every node once
    assert solver.simulate(graph, schedule.ops).peak <= schedule.budget


def _graph(forward_edges, attributes, training: bool) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(range(max(max(e) for e in forward_edges) + 1))
    graph.add_edges_from(forward_edges)
    if training:
        for v in graph.nodes:
            graph.nodes[v].update(mem=1, cost=1)
        graph = training_graph(graph)
    for v, (mem, cost) in attributes.items():
        graph.nodes[v].update(mem=mem, cost=cost)
    return graph


ROUNDS = [
    # The relaxation's first plan exceeds the budget in its recompute-free prefix (stage 2).
    (
        _graph(
            [(0, 1), (1, 2), (1, 4), (2, 3), (3, 4)],
            {0: (5, 1), 1: (6, 5), 2: (7, 5), 3: (4, 3), 4: (5, 5)},
            training=False,
        ),
        16,
    ),
    # ... and here in a stage that recomputes (training graph, backward nodes "d*").
    (
        _graph(
            [(0, 1), (1, 2), (2, 3)],
            {0: (4, 5), 1: (8, 2), 2: (8, 3), 3: (3, 4)}
            | {"d3": (7, 1), "d2": (2, 3), "d1": (1, 3), "d0": (1, 3)},
            training=True,
        ),
        25,
    ),
]


@pytest.mark.parametrize(("graph", "budget"), ROUNDS)
def test_a_relaxation_plan_over_the_budget_makes_its_stages_exact_and_is_solved_again(
    graph, budget
):
    """Found by a random search: the first relaxation plan does not fit, so `moments.relax`
    solves again with the offending stages exact (or starting earlier) and ends at the
    exhaustive optimum, proven."""
    expected = min_cost_within(stage_space_frontier(graph), budget)
    assert expected is not None
    options = replace(NO_COVER, moment_late_share=0.0, warm_starts=("policies",))
    schedule = solver.solve(graph, budget, time_limit=30, options=options)
    assert schedule.status == "OPTIMAL" and schedule.cost == expected
    assert solver.simulate(graph, schedule.ops).peak <= budget
    rounds = [
        (r["first_stage"], r["exact_stages"])
        for record in schedule.extra["steps"]
        for r in record.get("moment_rounds", ())
    ]
    assert len(rounds) >= 2 and rounds[1] != rounds[0]
