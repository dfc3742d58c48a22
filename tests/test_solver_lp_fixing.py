"""The LP proof phase never cuts off an optimal schedule, with either probe engine (CP-SAT or
HiGHS's branch and cut); the model-size guard counts the model that is built."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import small_graphs

import solver
from solver.deadline import Deadline
from solver.heuristics.eviction import evict_within
from solver.heuristics.registry import all_policies
from solver.milp.cpsat import CpSatModel
from solver.milp.formulation import build, variable_count
from solver.milp.highs_mip import HighsMip
from solver.milp.lp import solve_relaxation
from solver.milp.model import LinearModel, ModelResult
from solver.milp.plans import hint_values
from solver.milp.units import CostUnits


def _cpsat(lm: LinearModel, fixed: dict[int, int], cap: int) -> ModelResult:
    return CpSatModel(lm).solve(
        deadline=Deadline.after(30), workers=8, fixed=fixed, objective_cap=cap
    )


def _highs(lm: LinearModel, fixed: dict[int, int], cap: int) -> ModelResult:
    return HighsMip(lm).solve(deadline=Deadline.after(30), fixed=fixed, objective_cap=cap)


def _highs_unpresolved(lm: LinearModel, fixed: dict[int, int], cap: int) -> ModelResult:
    """As the exact search's climbing probes run it on the stage model."""
    mip = HighsMip(lm, presolve=False)
    return mip.solve(deadline=Deadline.after(30), fixed=fixed, objective_cap=cap)


@pytest.mark.parametrize(
    "engine", [_cpsat, _highs, _highs_unpresolved], ids=["cpsat", "highs", "highs-unpresolved"]
)
@settings(max_examples=30)
@given(graph=small_graphs(max_nodes=6))
def test_fixing_at_the_optimum_keeps_the_optimum(engine, graph):
    problem = solver.prepare(graph)
    frontier = stage_space_frontier(graph)
    units = CostUnits.of(problem)
    int_cost, unit = units.int_cost, units.unit
    assert unit == 1.0
    least = min(p for _, p in frontier)
    for budget in sorted({least, (least + solver.checkpoint_all_peak(problem)) // 2}):
        optimum = round(min_cost_within(frontier, budget)) - sum(int_cost)
        # Limit and cutoff at the optimum itself: the optimal schedule must survive both.
        lm = build(problem, budget, int_cost, recompute_limit=optimum)
        lp = solve_relaxation(lm, deadline=Deadline.after(30))
        assert lp is not None and lp.bound <= optimum
        fixed = lp.fixings(optimum)
        result = engine(lm, fixed, optimum)
        assert result.status == "OPTIMAL" and result.objective == optimum
        # One below the optimum nothing may remain.
        lm = build(problem, budget, int_cost, recompute_limit=optimum - 1)
        lp = solve_relaxation(lm, deadline=Deadline.after(30))
        fixed = {} if lp is None else lp.fixings(optimum - 1)
        assert engine(lm, fixed, optimum - 1).status == "INFEASIBLE"


@settings(max_examples=30)
@given(
    small_graphs(max_nodes=8),
    st.one_of(st.none(), st.integers(min_value=0, max_value=6)),
    st.integers(min_value=0, max_value=8),
    st.sets(st.integers(min_value=0, max_value=8)),
)
def test_variable_count_is_the_size_of_the_built_model(graph, limit, first, moments):
    """The stage model, and relaxations from a first stage with some stages bounded at their
    own node only."""
    problem = solver.prepare(graph)
    int_cost = CostUnits.of(problem).int_cost
    budget = solver.checkpoint_all_peak(problem)
    stage_model = build(problem, budget, int_cost, limit)
    assert variable_count(problem, int_cost, limit) == len(stage_model.names)
    first = min(first, problem.n)
    shape = {"first_stage": first, "moment_stages": moments}
    built = build(problem, budget, int_cost, limit, **shape)
    assert variable_count(problem, int_cost, limit, **shape) == len(built.names)


@settings(max_examples=30)
@given(small_graphs(max_nodes=8))
def test_hint_of_a_heuristic_schedule_is_a_complete_solution(graph):
    """hint_values gives every variable (levels and peak included) a value that satisfies the
    model, for policies and eviction runs alike: CP-SAT then starts from the incumbent instead of
    searching for a first solution."""
    problem = solver.prepare(graph)
    int_cost = CostUnits.of(problem).int_cost
    budget = (problem.memory_lower_bound + solver.checkpoint_all_peak(problem)) // 2
    evicted = evict_within(problem, budget)
    for member in [*all_policies(problem)[:3], *filter(None, [evicted])]:
        recompute = sum(int_cost[i] for k, i in member.schedule.ops if k == "compute")
        recompute -= sum(int_cost)
        for lm in (build(problem, None, int_cost), build(problem, budget, int_cost, recompute)):
            if lm.peak is None and member.schedule.peak > budget:
                continue
            hint = hint_values(lm, problem, member.plan)
            assert set(hint) | {0, 1} == set(range(len(lm.names)))  # all but "one" and "zero"
            result = CpSatModel(lm).solve(deadline=Deadline.after(30), workers=1, fixed=hint)
            assert result.status == "OPTIMAL"
            assert result.objective == (member.schedule.peak if lm.peak is not None else recompute)
