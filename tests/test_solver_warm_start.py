"""The warm starts (solver.heuristics.backward, solver.heuristics.least_peak): the backward search
is exhaustive over the stage space when it has no state limit (it finds a plan exactly where the
reference's dynamic program finds one), its plans fit their budget, it fits random_layered n=250 at
80% where eviction gets stuck; the least-peak search over both heuristics."""

from __future__ import annotations

import time
from types import SimpleNamespace

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_checks import RANDOM_250, check_within, steps_run
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import small_graphs

import solver
from solver import SolveOptions
from solver.core.stages import Member, checkpoint_all, plan_from_keep
from solver.deadline import Deadline
from solver.exact.state import Goal, Search
from solver.examples import chain
from solver.heuristics.backward import backward_runs, search
from solver.heuristics.eviction import eviction_runs
from solver.heuristics.least_peak import _bisect, least_peak
from solver.io import load_graph
from solver.milp.units import CostUnits


def _two_sinks() -> nx.DiGraph:
    """A DAG with a side output (node 2 is read by nobody) besides the last node."""
    graph = nx.DiGraph([(0, 1), (1, 2), (1, 3), (0, 3), (3, 4)])
    for v, (mem, cost) in enumerate([(3, 1), (4, 2), (5, 1), (2, 3), (1, 1)]):
        graph.nodes[v].update(mem=mem, cost=cost)
    return graph


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(small_graphs(max_nodes=6), st.just(_two_sinks())),
    st.integers(min_value=0, max_value=40),
    st.booleans(),
)
def test_the_unlimited_backward_search_fits_exactly_where_a_stage_plan_fits(graph, budget, by_cost):
    """Without a state limit the search is exhaustive (it only leaves out values no later compute
    reads, which never lowers a peak): it reaches a plan iff the exhaustive stage-space dynamic
    program has one within the budget, and that plan fits and costs no less than the optimum."""
    problem = solver.prepare(graph)
    optimum = min_cost_within(stage_space_frontier(graph), budget)
    member, _ = search(problem, budget, by_cost, max_states=10**7)
    assert (member is None) == (optimum is None)
    check_within(graph, problem, budget, member)
    if member is not None:
        assert member.schedule.cost >= optimum - 1e-9


@settings(max_examples=40, deadline=None)
@given(small_graphs(max_nodes=10), st.floats(min_value=0.0, max_value=1.0))
def test_backward_plans_fit_their_budget(graph, where):
    problem = solver.prepare(graph)
    low, high = problem.memory_lower_bound, checkpoint_all(problem).peak
    budget = round(low + where * (high - low))
    for member in backward_runs(problem, budget):
        check_within(graph, problem, budget, member)


def test_the_backward_search_fits_random_layered_at_80_percent():
    """random_layered n=250 at 80% of the checkpoint-all peak: every eviction run by direct
    reads gets stuck (those counting recomputations' reads fit, at 1.07x computing every node
    once); the backward searches fit (the cheaper within 6% of computing every node once), and
    the exact solver returns that or better within its time limit."""
    if not RANDOM_250.exists():
        pytest.skip(f"{RANDOM_250} not present")
    graph = load_graph(RANDOM_250)
    problem = solver.prepare(graph)
    budget = solver.parse_budget("80%", problem)
    evicted = eviction_runs(problem, budget)
    assert evicted and all(run.eviction.recompute_reads for run in evicted)
    runs = backward_runs(problem, budget)
    assert len(runs) == 2
    for member in runs:
        check_within(graph, problem, budget, member)
    cheapest = min(member.schedule.cost for member in runs)
    assert cheapest <= 1.06 * problem.total_cost
    schedule = solver.solve(graph, "80%", time_limit=10)
    assert schedule.status == "FEASIBLE" and schedule.peak <= budget
    assert schedule.cost <= cheapest
    assert problem.total_cost <= schedule.bound < schedule.cost


@settings(max_examples=30)
@given(small_graphs(max_nodes=8), st.one_of(st.none(), st.floats(min_value=1.0, max_value=3.0)))
def test_the_least_peak_search_keeps_within_the_compute_budget(graph, factor):
    """What the bisection returns fits the compute budget, and its peak is no higher than the
    checkpoint-all peak (which every graph's eviction run reaches with no recomputation)."""
    problem = solver.prepare(graph)
    compute_budget = None if factor is None else factor * problem.total_cost
    member = least_peak(problem, compute_budget)
    check_within(graph, problem, checkpoint_all(problem).peak, member)
    if member is not None and compute_budget is not None:
        assert member.schedule.cost <= compute_budget * (1 + 1e-12)


class _AfterProbes:
    """A test clock for `_bisect`: it has passed once made[1] probes reach made[0]."""

    def __init__(self, made: list[int]) -> None:
        self.made = made

    def passed(self) -> bool:
        return self.made[1] >= self.made[0]


def _threshold(least: int, made: list[int]):
    """A `fitting` for `_bisect`: a run peaking at the budget wherever it is at least `least`
    bytes, none below; each probe counted in made[1]."""

    def fitting(budget: int) -> SimpleNamespace | None:
        made[1] += 1
        return SimpleNamespace(schedule=SimpleNamespace(peak=budget)) if budget >= least else None

    return fitting


@pytest.mark.parametrize("least", [1_000_001, 3_000_000, 30_000_000, 99_800_000])
def test_the_bisection_ends_within_a_thousandth_of_the_top_above_the_least_fitting_budget(least):
    made = [10**9, 0]
    member = _bisect(_threshold(least, made), 1_000_000, 100_000_000, _AfterProbes(made))
    assert member is not None
    assert least <= member.schedule.peak <= least + 100_000_000 // 1000
    assert made[1] <= 40  # log2 of the ratio's logarithm over the precision, with room


def test_the_bisection_cut_short_is_near_a_least_peak_far_below_the_top():
    """The least fitting budget at 3% of the top, the floor at 1%: after three probes the best
    run is within 10% of it (the arithmetic middle would still be at 13%, 4.4x above)."""
    made = [3, 0]
    member = _bisect(_threshold(3_000_000, made), 1_000_000, 100_000_000, _AfterProbes(made))
    assert made[1] == 3
    assert member is not None and member.schedule.peak <= 1.1 * 3_000_000


@settings(max_examples=30, deadline=None, derandomize=True)
@given(small_graphs(max_nodes=8))
def test_the_least_peak_search_offers_each_new_least_peak_as_it_comes(graph):
    """`found` sees runs of strictly falling peak, the last of them the one returned."""
    seen: list[Member] = []
    member = least_peak(solver.prepare(graph), found=seen.append)
    peaks = [run.schedule.peak for run in seen]
    assert peaks == sorted(set(peaks), reverse=True)
    assert (seen[-1] is member) if seen else member is None


def test_the_least_peak_search_offers_several_runs_on_random_layered_n250():
    """Where the least peak is far below checkpoint-all's, the bisection finds it in steps, and
    each step's run is offered (so the least-peak search's incumbent falls while it runs)."""
    if not RANDOM_250.exists():
        pytest.skip(f"{RANDOM_250} not present")
    seen: list[Member] = []
    least_peak(
        solver.prepare(load_graph(RANDOM_250)), deadline=Deadline.after(4), found=seen.append
    )
    assert len(seen) >= 3


def test_the_least_peak_search_ends_at_the_one_line_bound_when_a_run_fits_it():
    """On a chain a run at the one-line bound fits: that run comes back, and the least-peak search
    returns it as optimal without evaluating the policy families."""
    graph = chain([3, 9, 2, 7, 4, 8, 1], [1] * 7)
    problem = solver.prepare(graph)
    member = least_peak(problem)
    assert member is not None and member.schedule.peak == problem.memory_lower_bound
    least = solver.solve(graph, objective="memory", time_limit=10)
    assert "checkpoint_policies" not in steps_run(least)  # closed before it
    assert least.status == "OPTIMAL" and least.peak == problem.memory_lower_bound


def test_pending_warm_starts_run_in_order_and_each_is_offered_as_it_finishes():
    """`Search.defer` puts work ahead of a named one; `run_pending` offers each work's schedules
    before the next starts, so that the next (the lifetime search) begins from the best."""
    graph = chain([2] * 6, [1] * 6)
    problem = solver.prepare(graph)
    now = time.perf_counter()
    goal = Goal("cost", CostUnits.of(problem))
    search = Search(graph, problem, goal, SolveOptions(), 1, Deadline.after(10), 10.0, now)
    seen: list[tuple[str, float | None]] = []
    everything = checkpoint_all(problem)
    member = Member("checkpoint-all", plan_from_keep(problem, range(problem.n)), everything)

    def work(name: str, found: list[Member]):
        def run() -> list[Member]:
            seen.append((name, None if search.incumbent is None else search.incumbent.param))
            return found

        return run

    search.defer("module_blocks", work("module_blocks", [member]))
    search.defer("policies", work("policies", []))
    search.defer("backward", work("backward", []))
    search.defer("lifetimes", work("lifetimes", []), before=("policies", "backward"))
    assert list(search.pending) == ["module_blocks", "lifetimes", "policies", "backward"]
    search.run_pending()
    best = "checkpoint-all"
    assert seen == [
        ("module_blocks", None),
        ("lifetimes", best),
        ("policies", best),
        ("backward", best),
    ]
    assert search.pending == {}


def test_the_steps_option_sets_the_least_peak_pipeline_too():
    from solver.exact.least_peak import checkpoint_policies
    from solver.examples import uniform_training_chain

    graph = uniform_training_chain(6)
    options = SolveOptions(steps=(checkpoint_policies,))
    schedule = solver.solve(graph, objective="memory", time_limit=10, options=options)
    assert steps_run(schedule) == ["checkpoint_policies"]
    solver.simulate(graph, schedule.ops).raise_if_invalid()
