"""LP rounding (solver.heuristics.rounding) yields valid plans from any kept sets. (The exact solver
runs it in its loop; tests/test_solver_optimality.py checks the optimum against the references.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from solver_strategies import small_graphs

import solver
from solver.core.simulate import simulate
from solver.core.stages import checkpoint_all, plan_from_kept_sets, plan_to_ops
from solver.heuristics.rounding import rounded_members


def _check(graph, problem, schedule) -> None:
    """The independent simulator agrees with the plan's own peak and cost."""
    ops = [(kind, problem.ids[i]) for kind, i in schedule.ops]
    sim = simulate(graph, ops)
    sim.raise_if_invalid()
    assert sim.peak == schedule.peak and abs(sim.cost - schedule.cost) < 1e-9


@settings(max_examples=40)
@given(small_graphs(max_nodes=8), st.randoms(use_true_random=False))
def test_any_wanted_sets_give_a_valid_plan(graph, rng):
    problem = solver.prepare(graph)
    n = problem.n
    wanted = [set()] + [{i for i in range(t) if rng.random() < 0.5} for t in range(1, n)] + [set()]
    plan = plan_from_kept_sets(problem, wanted)
    assert all(plan.computed[t][-1] == t for t in range(n))
    assert all(plan.kept[t] <= wanted[t] for t in range(n + 1))
    _check(graph, problem, plan_to_ops(problem, plan))


@settings(max_examples=20)
@given(small_graphs(max_nodes=8))
def test_keeping_everything_rounds_to_checkpoint_all(graph):
    problem = solver.prepare(graph)
    everything = [{i: 1.0 for i in range(t)} for t in range(problem.n)] + [{}]
    (member,) = {m.schedule.ops: m for m in rounded_members(problem, everything)}.values()
    _check(graph, problem, member.schedule)
    assert member.schedule.cost == problem.total_cost
    assert member.schedule.peak == checkpoint_all(problem).peak
