"""The SAC plan solver with a host link against brute force over every plan, offload choices
included (NOTE [ SAC offload model ], solver/sac/memory.py): the CP-SAT plan's cost (recompute,
price, overhead and the copies' stall) is the least of all plans whose reference peak fits the
budget and whose host bytes fit the link's; without a link the plan is the keep/recompute one."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sac_solver import all_plans, all_union_plans, problems, unions

from solver.core.link import Link
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError
from solver.sac import SacBlock, SacOp, SacPlan, SacProblem, Segment, plan_cost, plan_peak
from solver.sac.memory import block_stall, offloadable, plain_offload_bytes, plan_host
from solver.sac.plan_model import PlanModel
from solver.sac.solve import solve_sac
from solver.sac.union import SacUnion, UnionPlan, union_cost, union_host, union_peak

# 1e6 bytes per second: a drawn op's bytes (at most 50) copy in whole microseconds, as its
# drawn seconds are, so CP-SAT's nanoseconds are the reference's seconds exactly
SLOW = Link(1e6, 2e6)
FAST = Link(1e8, 1e8)  # 10 ns per byte


@st.composite
def offload_problems(draw) -> SacProblem:
    """`problems()` with some ops' output bytes dropped (so they can be offloaded), every
    op's seconds scaled by a drawn factor (so copies can hide behind compute) and a drawn
    runtime price per offloaded op."""
    problem = draw(problems())
    problem = dataclasses.replace(problem, offload_seconds=draw(st.sampled_from([0, 2e-6])))
    scale = draw(st.sampled_from([1, 10]))
    blocks = []
    for block in problem.blocks:
        ops = tuple(
            dataclasses.replace(
                op,
                seconds=op.seconds * scale,
                output_bytes=0 if draw(st.booleans()) else op.output_bytes,
            )
            for op in block.ops
        )
        blocks.append(dataclasses.replace(block, ops=ops))
    return dataclasses.replace(problem, blocks=tuple(blocks))


def with_offloads(problem: SacProblem, plan: SacPlan):
    """The plan with every subset of its saved offloadable ops offloaded, and each block not
    checkpointed that saves storages with them offloaded or not."""
    per_block, plains = [], []
    for block, saved, ckpt in zip(problem.blocks, plan.saved, plan.checkpointed, strict=True):
        choices = [i for i in sorted(saved) if offloadable(block.ops[i])]
        per_block.append(
            [
                frozenset(c)
                for r in range(len(choices) + 1)
                for c in itertools.combinations(choices, r)
            ]
        )
        plains.append([False, True] if not ckpt and plain_offload_bytes(block) else [False])
    for combo in itertools.product(*per_block):
        for plain in itertools.product(*plains):
            yield dataclasses.replace(
                plan,
                offloaded=combo if any(combo) else None,
                plain_offloaded=plain if any(plain) else None,
            )


def every_plan(problem: SacProblem):
    for plan in all_plans(problem):
        yield from with_offloads(problem, plan)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(offload_problems(), st.floats(0, 1), st.sampled_from([None, 0, 20, 60]), st.booleans())
def test_offload_optimum_is_the_brute_force_optimum(problem, where, host, fast):
    link = Link(*((FAST.d2h, FAST.h2d) if fast else (SLOW.d2h, SLOW.h2d)), host)
    plans = [
        (plan_peak(problem, p), plan_cost(problem, p, link))
        for p in every_plan(problem)
        if host is None or plan_host(problem, p) <= host
    ]
    low, high = min(p for p, _ in plans), max(p for p, _ in plans)
    budget = int(low + where * (high - low))
    best = min(c for p, c in plans if p <= budget)
    solution = solve_sac(problem, budget, Deadline.after(20), link=link)
    assert solution.status == "OPTIMAL"
    assert solution.peak <= budget
    assert solution.cost == pytest.approx(best, abs=1e-12)
    assert solution.host_peak == plan_host(problem, solution.plan)
    assert host is None or solution.host_peak <= host


@settings(max_examples=15, deadline=None, derandomize=True)
@given(offload_problems())
def test_min_with_offload_is_the_least_peak_over_every_plan(problem):
    least = min(plan_peak(problem, p) for p in every_plan(problem))
    solution = solve_sac(problem, "min", Deadline.after(20), link=SLOW)
    assert solution.peak == least


@settings(max_examples=20, deadline=None, derandomize=True)
@given(unions(), st.floats(0, 1))
def test_union_offload_optimum_is_the_brute_force_optimum(union, where):
    plans = []
    for plan in all_union_plans(union):
        flat = [plan.blocks, *(c for c in plan.children if c is not None)]
        # offload every saved offloadable op of each region, or none, and every region's saved
        # storages where it may or none: a subset of the space
        for choice in itertools.product([False, True], repeat=len(flat)):
            regions = [
                dataclasses.replace(
                    p,
                    offloaded=_all_offloadable(p, blocks) if on else None,
                    plain_offloaded=_all_plain(union, plan, p, blocks, k) if on else None,
                )
                for k, (p, blocks, on) in enumerate(
                    zip(flat, _region_blocks(union, plan), choice, strict=True)
                )
            ]
            children = iter(regions[1:])
            plans.append(
                UnionPlan(
                    regions[0], tuple(None if c is None else next(children) for c in plan.children)
                )
            )
    values = [(union_peak(union, p), union_cost(union, p, SLOW)) for p in plans]
    low, high = min(p for p, _ in values), max(p for p, _ in values)
    budget = int(low + where * (high - low))
    best = min(c for p, c in values if p <= budget)
    solution = solve_sac(union, budget, Deadline.after(20), link=SLOW)
    assert solution.status == "OPTIMAL"
    assert solution.peak <= budget
    assert solution.cost <= best + 1e-12  # the brute force covers part of the space
    assert solution.host_peak == union_host(union, solution.plan)


def _region_blocks(union: SacUnion, plan: UnionPlan):
    yield union.blocks.blocks
    for split in union.splits:
        if split is not None:
            yield split.children


def _all_plain(
    union: SacUnion, whole: UnionPlan, plan: SacPlan, blocks, k: int
) -> tuple[bool, ...] | None:
    """Each region not checkpointed that may offload its saved storages does (k = 0: the
    blocks, where only those without a split may; else the k-th split's children, whose block
    is not checkpointed whole)."""
    allowed = [s is None for s in union.splits]
    if k:
        owner = [j for j, s in enumerate(union.splits) if s is not None][k - 1]
        allowed = [not whole.blocks.checkpointed[owner]] * len(blocks)
    plain = tuple(
        ok and not c and plain_offload_bytes(b) > 0
        for b, c, ok in zip(blocks, plan.checkpointed, allowed, strict=True)
    )
    return plain if any(plain) else None


def _all_offloadable(plan: SacPlan, blocks) -> tuple[frozenset[int], ...] | None:
    sets = tuple(
        frozenset(i for i in saved if offloadable(b.ops[i]))
        for b, saved in zip(blocks, plan.saved, strict=True)
    )
    return sets if any(sets) else None


@settings(max_examples=25, deadline=None, derandomize=True)
@given(offload_problems(), st.floats(0, 1))
def test_without_a_link_the_plan_offloads_nothing_and_a_link_only_lowers_the_cost(problem, where):
    """No link: the model has no offload variables (the keep/recompute solve that
    tests/test_sac_solver.py holds to brute force); a plan offloading nothing costs the same
    with a link; with one, the optimum costs at most the keep/recompute optimum."""
    low = min(plan_peak(problem, p) for p in all_plans(problem))
    budget = int(low + where * (problem.plain_peak - low))
    plain = solve_sac(problem, budget, Deadline.after(20))
    assert plain.plan.offloaded is None and plain.host_peak == 0
    names = {v.name for v in PlanModel(SacUnion.whole(problem), budget).m.Proto().variables}
    assert not any(n.startswith(("o", "q", "wf", "wr")) for n in names)  # no offload variables
    assert plan_cost(problem, plain.plan, SLOW) == plain.cost
    offloading = solve_sac(problem, budget, Deadline.after(20), link=FAST)
    assert offloading.cost <= plain.cost + 1e-12


def test_only_offload_fits_where_recompute_needs_the_scratch_and_keeping_holds_the_turn():
    """One region: op 0 (40 bytes, autograd saves them, its kernel holds 200 scratch bytes)
    read by op 1 (the output). Recomputing op 0 needs its scratch in the backward (100 + 200),
    keeping it holds 40 more bytes through the turn (a segment at 280 with the block held): at
    250 bytes only the plan that offloads op 0 fits (its reload is not rerun: no scratch), and
    without a link, or with a host of 39 bytes, 250 bytes is refused."""
    ops = (
        SacOp("aten.mm", 40, 4e-6, 1, 40, True, scratch=200),
        SacOp("aten.relu", 10, 1e-6, 1, 0, False, output_bytes=10),
    )
    block = SacBlock("b", ops, 0, 0, 0, f_start=0, f_peak=240, b_start=100, b_peak=100)
    problem = SacProblem((block,), (Segment(280, 1),), plain_peak=300)
    with pytest.raises(InfeasibleBudgetError, match="least predicted peak in SAC's space is 280"):
        solve_sac(problem, 250, Deadline.after(10))
    solution = solve_sac(problem, 250, Deadline.after(10), link=SLOW)
    assert solution.plan.offloaded == (frozenset({0}),)
    assert (solution.peak, solution.host_peak) == (240, 40)
    # 40 bytes copy out in 40 us from the op's end (4 us) past the forward's end (5 us), and
    # back in 20 us, read at the recompute's start: 39 + 20 us of stall, nothing rerun
    assert solution.cost == pytest.approx(59e-6, abs=1e-12)
    with pytest.raises(InfeasibleBudgetError):
        solve_sac(problem, 250, Deadline.after(10), link=Link(1e6, 2e6, 39))


def test_block_stall_follows_the_fifo_engines():
    ops = tuple(SacOp(f"op{i}", 10, 5e-6, 3, 10, True) for i in range(4))
    block = SacBlock("b", ops, 3, 0, 0, f_start=0, f_peak=0, b_start=0, b_peak=0)
    link = Link(1e6, 1e6)  # 10 bytes: 10 us each way
    # offloads after op 0 (5 us) and op 1 (10 us): engine ends 15 then 25; forward ends at 20
    # reloads arrive at 10 and 20; op 0 is not rerun (saved), op 1 neither, so both wait:
    # 10 us at op 0, then 10 more at op 1
    assert block_stall(block, {0, 1}, {0, 1}, link) == pytest.approx(5e-6 + 20e-6)
    # op 2 offloaded alone: issued at 15, ends 25 (5 past the forward); its reload arrives at
    # 10, and ops 0, 1 rerun for 10 us before it: no wait
    assert block_stall(block, {2}, {2}, link) == pytest.approx(5e-6)
