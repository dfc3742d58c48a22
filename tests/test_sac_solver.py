"""The SAC plan solver against brute force over every plan on small drawn problems: the CP-SAT
plan's cost (recompute, plus each checkpointed region's price, negative ones included, plus
the SAC runtime's overhead of each region saving an op) is the least of all plans whose
reference peak (`solver.sac.plan_peak`) fits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError
from solver.sac import SacBlock, SacOp, SacPlan, SacProblem, Segment, plan_cost, plan_peak
from solver.sac.solve import solve_sac
from solver.sac.union import SacSplit, SacUnion, UnionPlan, flatten, union_cost, union_peak


@st.composite
def blocks(draw, name: str, most: int = 4) -> SacBlock:
    n = draw(st.integers(1, most))
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
        overhead=draw(st.integers(0, 12)) * 1e-6,
        price=draw(st.integers(-12, 12)) * 1e-6,
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


@st.composite
def unions(draw) -> SacUnion:
    n = draw(st.integers(1, 2))
    whole = tuple(draw(blocks(f"b{j}", 3)) for j in range(n))
    segs = tuple(Segment(draw(st.integers(0, 300)), draw(st.integers(0, n))) for _ in range(2))
    splits = []
    for j in range(n):
        if not draw(st.booleans()):
            splits.append(None)
            continue
        k = draw(st.integers(1, 2))
        children = tuple(draw(blocks(f"b{j}.{c}", 2)) for c in range(k))
        inner = tuple(Segment(draw(st.integers(0, 300)), draw(st.integers(0, k))) for _ in range(2))
        splits.append(SacSplit(children, inner))
    return SacUnion(SacProblem(whole, segs, plain_peak=300), tuple(splits))


def all_union_plans(union: SacUnion):
    off = SacPlan((False,), (frozenset(),))
    per_block = []
    for j, block in enumerate(union.blocks.blocks):
        single = SacProblem((block,), (), 0)
        options = []
        for whole in all_plans(single):
            split = union.splits[j]
            if split is None:
                options.append((whole, None))
            elif whole.checkpointed[0]:
                options.append(
                    (
                        whole,
                        SacPlan(
                            (False,) * len(split.children), (frozenset(),) * len(split.children)
                        ),
                    )
                )
            else:
                for sub in all_plans(SacProblem(split.children, (), 0)):
                    options.append((off, sub))
        per_block.append(options)
    for combo in itertools.product(*per_block):
        blocks_plan = SacPlan(
            tuple(w.checkpointed[0] for w, _ in combo), tuple(w.saved[0] for w, _ in combo)
        )
        yield UnionPlan(blocks_plan, tuple(sub for _, sub in combo))


@settings(max_examples=25, deadline=None)
@given(unions(), st.floats(0, 1) | st.just("min"))
def test_union_optimum_is_the_brute_force_optimum_over_every_granularity(union, where):
    plans = [(union_peak(union, p), union_cost(union, p)) for p in all_union_plans(union)]
    low, high = min(p for p, _ in plans), max(p for p, _ in plans)
    budget = low if where == "min" else int(low + where * (high - low))
    best = min(c for p, c in plans if p <= budget)
    solution = solve_sac(union, "min" if where == "min" else budget, Deadline.after(20))
    assert solution.status == "OPTIMAL" and solution.gap == 0.0
    assert solution.budget == budget and solution.peak <= budget
    assert solution.cost == pytest.approx(best, abs=1e-12)
    assert union_peak(union, solution.plan) == solution.peak
    with pytest.raises(
        InfeasibleBudgetError, match=f"least predicted peak in SAC's space is {low}"
    ):
        solve_sac(union, low - 1, Deadline.after(20))


def test_a_union_without_splits_is_its_blocks_problem():
    block = SacBlock("b", (SacOp("op", 8, 1e-6, 0, 8, True),), 0, 1, 0, 0, 8, 8, 16)
    problem = SacProblem((block, block), (Segment(20, 1),), 40)
    plan = SacPlan((True, False), (frozenset({0}), frozenset()))
    union, union_plan = SacUnion.whole(problem), UnionPlan(plan, (None, None))
    assert flatten(union, union_plan) == (problem, plan)
    assert union_peak(union, union_plan) == plan_peak(problem, plan)


def test_a_child_region_fits_where_the_whole_block_and_no_region_do_not():
    """The block's plain forward peaks at 150 while its second child runs; checkpointing its
    first child frees 100 bytes by then, while the whole block would hold 1,000 bytes of
    inputs: only the child region fits 120."""
    op0 = SacOp("op0", 100, 1e-6, 0, 100, True)
    op1 = SacOp("op1", 50, 1e-6, 0, 0, True)
    child0 = SacBlock("b.0", (op0,), 0, 0, 0, 0, 100, 100, 100)
    child1 = SacBlock("b.1", (op1,), -1, 0, 0, 100, 150, 150, 150)
    block = SacBlock("b", (op0, op1), 0, 1000, 0, 0, 150, 150, 150)
    union = SacUnion(
        SacProblem((block,), (Segment(150, 1),), 150), (SacSplit((child0, child1), ()),)
    )
    solution = solve_sac(union, 120, Deadline.after(20))
    assert solution.plan.children[0].checkpointed == (True, False)
    assert not solution.plan.blocks.checkpointed[0] and solution.peak <= 120


def test_a_region_whose_price_exceeds_its_savings_is_not_chosen():
    """The step peaks at 200 after both blocks; checkpointing either one saves its 100 bytes.
    Block 1's recompute is the cheaper by the recorded seconds; its checkpoint price makes it
    the dearer region (4 us against 1.5 us, block 0's price negative)."""
    op = SacOp("op", 100, 2e-6, 0, 100, False)
    cheap = SacOp("op", 100, 1e-6, 0, 100, False)
    first = SacBlock("b0", (op,), 0, 0, 0, 0, 100, 100, 100, price=-0.5e-6)
    second = SacBlock("b1", (cheap,), 0, 0, 0, 0, 100, 100, 100, price=3e-6)
    problem = SacProblem((first, second), (Segment(200, 2),), 200)
    solution = solve_sac(problem, 150, Deadline.after(20))
    plan = SacPlan((True, False), (frozenset(), frozenset()))
    assert solution.plan == plan
    assert solution.cost == pytest.approx(1.5e-6, abs=1e-12) == plan_cost(problem, plan)


_ROWS = st.lists(
    st.tuples(
        st.integers(-50, 200),
        st.dictionaries(st.integers(0, 4), st.integers(-60, 60), max_size=5),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(rows=_ROWS)
def test_rows_left_out_are_implied_by_those_kept(rows):
    """`binding_rows` keeps the same feasible set: for every assignment of the 0/1 variables the
    largest left-hand side over the kept rows is the largest over all rows, so `<= P` holds
    for the kept rows exactly where it holds for all (checked by enumeration)."""
    from solver.sac.plan_model import binding_rows

    kept = binding_rows(rows)
    assert kept
    for bits in itertools.product((0, 1), repeat=5):

        def lhs(row, bits=bits):
            const, coef = row
            return const + sum(k * bits[i] for i, k in coef.items())

        assert max(map(lhs, kept)) == max(map(lhs, rows))
