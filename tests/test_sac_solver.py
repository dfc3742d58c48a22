"""The SAC plan solver against brute force over every plan on small drawn problems: the CP-SAT
plan's cost is the least of all plans whose reference peak (`solver.sac.plan_peak`) fits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError
from solver.sac import SacBlock, SacOp, SacPlan, SacProblem, Segment, plan_cost, plan_peak
from solver.sac.solve import solve_sac
from solver.sac.spaces import solve_spaces


@st.composite
def blocks(draw, name: str) -> SacBlock:
    n = draw(st.integers(1, 4))
    ops = []
    for i in range(n):
        new_bytes = draw(st.integers(0, 50))
        saved_bytes = draw(st.sampled_from([0, new_bytes, new_bytes // 3]))
        ops.append(
            SacOp(
                name=f"op{i}",
                new_bytes=new_bytes,
                seconds=draw(st.integers(0, 9)) * 1e-6,
                last_read=draw(st.integers(i, n - 1)),
                saved_bytes=saved_bytes,
                saveable=draw(st.booleans()),
                scratch=draw(st.integers(0, 20)),
                output_bytes=draw(st.integers(0, new_bytes - saved_bytes)),
            )
        )
    stop = max((i for i, op in enumerate(ops) if op.saved_bytes), default=-1)
    f_start = draw(st.integers(0, 100))
    b_start = draw(st.integers(0, 200))
    return SacBlock(
        name=name,
        ops=tuple(ops),
        stop=stop,
        held_extra=draw(st.integers(0, 10)),
        workspace=draw(st.integers(0, 10)),
        f_start=f_start,
        f_peak=f_start + draw(st.integers(0, 150)),
        b_start=b_start,
        b_peak=b_start + draw(st.integers(0, 50)),
        recompute_extra=draw(st.integers(0, 5)),
    )


@st.composite
def problems(draw) -> SacProblem:
    n = draw(st.integers(1, 3))
    bs = tuple(draw(blocks(f"b{j}")) for j in range(n))
    segs = tuple(
        Segment(draw(st.integers(0, 300)), draw(st.integers(0, n)))
        for _ in range(draw(st.integers(0, 2)))
    )
    return SacProblem(bs, segs, plain_peak=300)


def all_plans(problem: SacProblem):
    per_block = []
    for block in problem.blocks:
        options = [(False, frozenset())]
        choices = [i for i, op in enumerate(block.ops[: block.stop + 1]) if op.saveable]
        for r in range(len(choices) + 1):
            options += [(True, frozenset(c)) for c in itertools.combinations(choices, r)]
        per_block.append(options)
    for combo in itertools.product(*per_block):
        yield SacPlan(tuple(c for c, _ in combo), tuple(s for _, s in combo))


@settings(max_examples=40, deadline=None)
@given(problems(), st.floats(0, 1))
def test_solver_cost_is_the_brute_force_optimum(problem, where):
    plans = [(plan_peak(problem, p), plan_cost(problem, p)) for p in all_plans(problem)]
    low, high = min(p for p, _ in plans), max(p for p, _ in plans)
    budget = int(low + where * (high - low))
    best = min(c for p, c in plans if p <= budget)
    solution = solve_sac(problem, budget, Deadline.after(20))
    assert solution.status == "OPTIMAL"
    assert solution.peak <= budget
    assert solution.cost == pytest.approx(best, abs=1e-12)
    assert plan_peak(problem, solution.plan) == solution.peak


@settings(max_examples=15, deadline=None)
@given(problems())
def test_min_budget_is_the_least_peak_and_below_it_is_refused(problem):
    plans = list(all_plans(problem))
    least = min(plan_peak(problem, p) for p in plans)
    solution = solve_sac(problem, "min", Deadline.after(20))
    assert solution.peak == least
    best = min(plan_cost(problem, p) for p in plans if plan_peak(problem, p) <= least)
    assert solution.cost == pytest.approx(best, abs=1e-12)
    with pytest.raises(
        InfeasibleBudgetError, match=f"least predicted peak in SAC's space is {least}"
    ):
        solve_sac(problem, least - 1, Deadline.after(20))


@settings(max_examples=20, deadline=None)
@given(st.lists(problems(), min_size=2, max_size=2), st.floats(0, 1) | st.just("min"))
def test_space_choice_is_the_brute_force_optimum_over_both_spaces(spaces, where):
    plans = [
        (k, plan_peak(problem, p), plan_cost(problem, p))
        for k, problem in enumerate(spaces)
        for p in all_plans(problem)
    ]
    low, high = min(p for _, p, _ in plans), max(p for _, p, _ in plans)
    budget = low if where == "min" else int(low + where * (high - low))
    best = min(c for _, p, c in plans if p <= budget)
    choice = solve_spaces(spaces, "min" if where == "min" else budget, Deadline.after(20))
    solution = choice.solution
    assert solution.status == "OPTIMAL" and solution.gap == 0.0
    assert solution.budget == budget and solution.peak <= budget
    assert solution.cost == pytest.approx(best, abs=1e-12)
    assert plan_peak(spaces[choice.space], solution.plan) == solution.peak
    for k, cost in enumerate(choice.costs):
        fits = [c for j, p, c in plans if j == k and p <= budget]
        assert cost == pytest.approx(min(fits, default=float("inf")), abs=1e-12)
    least = f"least predicted peak in SAC's space is {low}"
    with pytest.raises(InfeasibleBudgetError, match=least):
        solve_spaces(spaces, low - 1, Deadline.after(20))
