"""The eviction heuristic (solver.heuristics.eviction), by distance or guided by an LP's keep
fractions: its schedules are valid and within their budget, and it fits where the checkpoint
policies cannot. The search over its choices (solver.heuristics.eviction_search): valid, never
above the rule's runs nor below the exhaustive optimum, deterministic, and reaching the proven
optimum where the rule does not. The least-peak search over it and the backward search:
tests/test_solver_warm_start.py."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_checks import RANDOM_250, check_within
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import small_graphs, training_graphs

import solver
from solver.core.stages import cheapest_within, checkpoint_all
from solver.deadline import NEVER, Deadline
from solver.examples import chain, residual_demo, training_graph
from solver.heuristics.baselines import BASELINES
from solver.heuristics.eviction import (
    DISTANCE_EXPONENTS,
    evict_by_keep,
    evict_within,
    eviction_runs,
)
from solver.heuristics.eviction_search import (
    PINNED,
    EvictionMoves,
    eviction_search,
    peak_search,
    pin_candidates,
)
from solver.io import load_graph


def _budget(problem, where: float) -> int:
    """A budget `where` of the way from the one-line bound to the checkpoint-all peak."""
    low, high = problem.memory_lower_bound, checkpoint_all(problem).peak
    return round(low + where * (high - low))


@settings(max_examples=60)
@given(small_graphs(max_nodes=8), st.floats(min_value=0.0, max_value=1.0))
def test_every_eviction_run_fits_its_budget(graph, where):
    """Both kinds of reads, every exponent: each run that does not get stuck is a replayed
    schedule within the budget."""
    problem = solver.prepare(graph)
    budget = _budget(problem, where)
    runs = eviction_runs(problem, budget)
    assert len(runs) <= 2 * len(DISTANCE_EXPONENTS)
    for run in runs:
        check_within(graph, problem, budget, run)
    assert evict_within(problem, budget) == cheapest_within(runs, budget)


def _tied_head() -> nx.DiGraph:
    """The training graph of a five-step chain plus a last node reading the head's gradient d4
    and the first step's d0, as a tied embedding's weight gradient sums its two parts: d4 is
    computed first in the backward and read again only at the end."""
    graph = training_graph(chain([4, 2, 2, 4, 2], [1, 5, 5, 2, 5]))
    order = list(graph.graph["order"])
    graph.add_node("tie", mem=1, cost=1, phase="backward")
    graph.add_edges_from([("d4", "tie"), ("d0", "tie")])
    graph.graph["order"] = [*order, "tie"]
    return graph


def test_counting_recomputations_reads_keeps_what_a_late_rebuild_starts_from():
    """At 12 bytes every run by direct reads costs 89 units: once its own readers are done, the
    value d4's rebuild starts from is dropped first, and the last stage recomputes the chain
    from the start. Counting the reads of d4's recomputation keeps it: 79. The exact solver
    proves 67 (the exhaustive stage-space reference agrees, in minutes)."""
    graph = _tied_head()
    problem = solver.prepare(graph)
    runs = eviction_runs(problem, 12)
    costs = {run.eviction.recompute_reads: set() for run in runs}
    for run in runs:
        check_within(graph, problem, 12, run)
        costs[run.eviction.recompute_reads].add(run.schedule.cost)
    assert costs == {False: {89.0}, True: {79.0}}
    optimum = solver.solve(graph, 12, time_limit=30)
    assert optimum.status == "OPTIMAL" and optimum.cost == 67.0


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


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.one_of(small_graphs(max_nodes=7), training_graphs(forward_nodes=3)),
    st.floats(min_value=0.0, max_value=1.0),
    st.booleans(),
)
def test_the_eviction_search_is_valid_and_between_the_rule_and_the_optimum(graph, where, mirrored):
    """A replayed schedule within the budget, no dearer than the rule's best run and no
    cheaper than the exhaustive stage-space optimum; the same rounds give the same schedule.
    The drawn graphs' module paths give some of them repeated blocks (mirrored priorities)."""
    problem = solver.prepare(graph)
    budget = _budget(problem, where)
    rule = evict_within(problem, budget)
    searched = eviction_search(
        problem, budget, deadline=NEVER, rounds=30, moves=EvictionMoves(mirrored=mirrored)
    )
    if rule is None:
        assert searched is None
        return
    assert searched is not None
    check_within(graph, problem, budget, searched)
    assert searched.schedule.cost <= rule.schedule.cost
    optimum = min_cost_within(stage_space_frontier(graph), budget)
    assert optimum is not None and optimum <= searched.schedule.cost + 1e-9
    again = eviction_search(
        problem, budget, deadline=NEVER, rounds=30, moves=EvictionMoves(mirrored=mirrored)
    )
    assert again is not None and again.schedule.ops == searched.schedule.ops


UNEVEN_CHAIN = training_graph(chain([4, 9, 9, 4, 7, 9], [6, 6, 8, 5, 9, 1]))
"""A chain of six steps whose bytes and costs differ, where the rule's best run is not optimal
at tight budgets."""


@pytest.mark.parametrize("budget", [34, 49])
def test_the_eviction_search_reaches_the_proven_optimum_where_the_rule_does_not(budget):
    """Computing every node once costs 105 units. At 34 bytes the rule's best run recomputes 26
    of them where 20 suffice, at 49 bytes 6 where 5 suffice; the exact solver proves both
    optima, and the search ends at them (each cheaper run reported as it comes)."""
    problem = solver.prepare(UNEVEN_CHAIN)
    rule = evict_within(problem, budget)
    optimum = solver.solve(UNEVEN_CHAIN, budget, time_limit=30)
    assert optimum.status == "OPTIMAL" and rule is not None
    assert rule.schedule.cost > optimum.cost
    found: list[float] = []
    searched = eviction_search(
        problem,
        budget,
        deadline=Deadline.after(30),
        rounds=200,
        found=lambda member: found.append(member.schedule.cost),
    )
    assert searched is not None and searched.schedule.cost == optimum.cost
    check_within(UNEVEN_CHAIN, problem, budget, searched)
    assert found == sorted(found, reverse=True) and found[-1] == optimum.cost
    resumed = eviction_search(problem, budget, deadline=NEVER, resume=searched, rounds=10)
    assert resumed is not None and resumed.schedule.cost == optimum.cost


def test_the_eviction_search_needs_a_fitting_rule_run():
    """Below the one-line bound no run fits, so there is nothing to search from."""
    problem = solver.prepare(UNEVEN_CHAIN)
    budget = problem.memory_lower_bound - 1
    assert eviction_search(problem, budget, deadline=NEVER, rounds=10) is None


def test_the_eviction_search_starts_from_the_rule_where_the_run_to_resume_does_not_fit():
    """A run found at a looser budget peaks above a tighter one: the search ignores it."""
    problem = solver.prepare(UNEVEN_CHAIN)
    loose = eviction_search(problem, 60, deadline=NEVER, rounds=5)
    assert loose is not None and loose.schedule.peak > 34
    from_loose = eviction_search(problem, 34, deadline=NEVER, resume=loose, rounds=20)
    from_rule = eviction_search(problem, 34, deadline=NEVER, rounds=20)
    assert from_loose is not None and from_rule is not None
    assert from_loose.schedule.ops == from_rule.schedule.ops


PIN_CHAIN = training_graph(chain([9, 7, 6, 8, 1], [8, 1, 5, 7, 3]))
"""A five-step chain whose first backward node and first step's gradient are read again by a last
node (as `_tied_head`'s), where pinning one value beats every run by rule at 30 bytes."""
PIN_CHAIN.add_node("tie", mem=1, cost=1, phase="backward")
PIN_CHAIN.add_edges_from([("d4", "tie"), ("d0", "tie")])
PIN_CHAIN.graph["order"] = [*PIN_CHAIN.graph["order"], "tie"]


def test_pin_candidates_rank_the_recomputed_values_by_what_they_rebuild_per_byte():
    """Every value a plan recomputes, none it does not, ordered by the cost of the recomputed
    stretch each one ends per byte of it (computed here from the plan's stages)."""
    problem = solver.prepare(PIN_CHAIN)
    plan = evict_within(problem, 30).plan
    saved = [0.0] * problem.n
    for t, stage in enumerate(plan.computed):
        recomputed = set(stage) - {t}
        for u in recomputed:
            ancestors = nx.ancestors(PIN_CHAIN, problem.ids[u])
            stretch = [w for w in recomputed if problem.ids[w] in ancestors or w == u]
            # a chain: one path to each ancestor, so the over-count of shared ones is nil
            saved[u] += sum(problem.cost[w] for w in stretch)
    ranked = pin_candidates(problem, plan)
    assert set(ranked) == {u for u in range(problem.n) if saved[u] > 0}
    ratios = [saved[u] / problem.mem[u] for u in ranked]
    assert ratios == sorted(ratios, reverse=True)


def test_a_pin_alone_reaches_the_optimum_where_every_run_by_rule_does_not():
    """At 30 bytes every run by rule costs 112 units and the proven optimum is 81. The chain
    that pins takes every other round; within twice as many rounds as the rule's best run has
    pin candidates it reaches 81 by pins alone (every factor 1 or `PINNED`), first."""
    problem = solver.prepare(PIN_CHAIN)
    rule = evict_within(problem, 30)
    optimum = solver.solve(PIN_CHAIN, 30, time_limit=30)
    assert rule is not None and {run.schedule.cost for run in eviction_runs(problem, 30)} == {112}
    assert optimum.status == "OPTIMAL" and optimum.cost == 81.0
    rounds = 2 * len(pin_candidates(problem, rule.plan))
    pinned = eviction_search(problem, 30, deadline=NEVER, rounds=rounds)
    assert pinned is not None and pinned.schedule.cost == 81.0
    check_within(PIN_CHAIN, problem, 30, pinned)
    assert set(pinned.eviction.priorities) == {1.0, PINNED}


@settings(max_examples=25, deadline=None, derandomize=True)
@given(training_graphs(forward_nodes=7), st.floats(min_value=1.0, max_value=1.6))
def test_the_peak_search_lowers_the_peak_within_the_cost_cap(graph, factor):
    """From the rule's run at the checkpoint-all peak, every run `peak_search` keeps peaks
    lower than the last, costs at most the cap and replays in the simulator at the peak and
    cost it reports; the one returned is the last kept (or the start)."""
    problem = solver.prepare(graph)
    start = evict_within(problem, checkpoint_all(problem).peak)
    assert start is not None  # the rule fits the checkpoint-all peak with no recomputation
    cap = max(start.schedule.cost, factor * problem.total_cost)
    kept: list = []
    deadline = Deadline.after(0.2)
    best = peak_search(problem, start, deadline=deadline, cost_cap=cap, found=kept.append)
    peaks = [start.schedule.peak] + [run.schedule.peak for run in kept]
    assert all(lower < higher for higher, lower in itertools.pairwise(peaks))
    assert best is (kept[-1] if kept else start)
    for run in kept:
        assert run.schedule.cost <= cap
        check_within(graph, problem, start.schedule.peak, run)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(training_graphs(forward_nodes=7))
def test_the_peak_search_stops_at_the_first_run_peaking_at_or_under_enough(graph):
    """With `enough` one byte under the start's peak, the search keeps at most one run (the
    first that fits under it) and returns it."""
    problem = solver.prepare(graph)
    start = evict_within(problem, checkpoint_all(problem).peak)
    assert start is not None
    kept: list = []
    enough = start.schedule.peak - 1
    best = peak_search(
        problem, start, deadline=Deadline.after(0.3), enough=enough, found=kept.append
    )
    assert len(kept) <= 1
    assert best is (kept[0] if kept else start)
    assert not kept or best.schedule.peak <= enough
