"""A solve's status and proof do not depend on the unit its costs are written in, and the
incumbent only improves while two threads update the search.

Captured graphs live at 1e6-1e9 whole cost units (`solver.milp.units.CostUnits`); a proof read
with a relative margin there falls tens to hundreds of units short of the incumbent and never
closes the search (NOTE [safe bounds] in `solver.milp.units`). These tests draw costs at those
scales, decimal and non-decimal multipliers of them, and compare with the exhaustive reference.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_checks import probes_reach_the_optimum
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import small_graphs, training_graphs

import solver
from solver.deadline import Deadline
from solver.exact import warm_start
from solver.exact.moments import relax
from solver.exact.options import SolveOptions
from solver.exact.state import Goal, Search
from solver.examples import residual_demo
from solver.heuristics.registry import all_policies
from solver.io import load_graph
from solver.milp.model import ModelResult
from solver.milp.units import CostUnits, integer_floor, safe_floor

TIME_LIMIT = 30.0
OPTIONS = (SolveOptions(), SolveOptions(cover=False))
"""The whole search, and the search without the covers, whose proofs (exact when the cover's
CP-SAT optimum meets the incumbent) would otherwise close most small graphs before the stage
model's engines have to."""
VGG19 = Path(__file__).resolve().parents[2] / "shared/graphs/VGG19_256_224x224x3_train_nx.json"


def test_integer_bounds_are_read_without_a_margin():
    """CP-SAT's bounds are whole numbers: read exactly at any size, where the floating-point
    reading takes a relative margin off."""
    for value in (7, 123_456_789, 987_654_321_012):
        assert integer_floor(float(value)) == value
        assert safe_floor(float(value)) < value or value < 10**6
    assert integer_floor(10.3) <= 11  # never above the ceiling
    assert integer_floor(math.inf) == integer_floor(-1.0) == 0


def test_a_result_proves_the_same_whole_units_at_any_scale():
    """What a result proves is exact for CP-SAT and for HiGHS's verdicts at an integer cap,
    bounded by the cap + 1, and only HiGHS's running bound takes a margin."""
    big = 4_000_000_000
    assert ModelResult("OPTIMAL", [1], big, float(big), exact=True).proven(None) == big
    assert ModelResult("FEASIBLE", [1], big + 5, float(big), exact=True).proven(None) == big
    assert ModelResult("UNKNOWN", None, None, float(big), exact=True).proven(big - 10) == big - 9
    assert ModelResult("INFEASIBLE", None, None, 0.0).proven(big) == big + 1
    assert ModelResult("OPTIMAL", [1], big, float(big)).proven(big) == big  # HiGHS's verdict
    assert ModelResult("FEASIBLE", [1], big + 5, float(big)).proven(None) < big  # its bound
    with pytest.raises(AssertionError):
        ModelResult("INFEASIBLE", None, None, 0.0).proven(None)


@st.composite
def large_cost_graphs(draw) -> tuple:
    """Small graphs with costs of 1e6-1e9 whole units times a multiplier: 1 (whole), decimal
    ones (scaled to whole units exactly, up to 1e12 of them) and pi (rounded units)."""
    graph = draw(small_graphs(max_nodes=6))
    factor = draw(st.sampled_from([1.0, 1e-3, 0.37, 1234.567, math.pi]))
    for v in graph.nodes:
        graph.nodes[v]["cost"] = draw(st.integers(min_value=10**6, max_value=10**9)) * factor
    return graph, factor


@settings(max_examples=20)
@given(large_cost_graphs())
def test_large_cost_scales_solve_to_the_exhaustive_optimum(drawn):
    graph, factor = drawn
    frontier = stage_space_frontier(graph)
    problem = solver.prepare(graph)
    # decimal multipliers are exact in whole units; pi's costs are rounded to 1e-6 of the largest
    exact = CostUnits.of(problem).scale != 0
    least = min(p for _, p in frontier)
    for budget in sorted({least, (least + solver.checkpoint_all_peak(problem)) // 2}):
        expected = min_cost_within(frontier, budget)
        for options in OPTIONS:
            schedule = solver.solve(graph, budget, time_limit=TIME_LIMIT, options=options)
            assert schedule.status == "OPTIMAL", (factor, budget, schedule.extra["steps"])
            assert schedule.cost == pytest.approx(expected, rel=1e-12 if exact else 1e-5)
            assert solver.simulate(graph, schedule.ops).peak <= budget


def test_both_probe_engines_prove_the_optimum_at_large_cost_scales():
    """HiGHS's climbing caps and CP-SAT's run from the incumbent, each forced to close the gap
    alone, on costs of 1e6-1e9 units: every verdict at an integer cap is read as it stands (no
    margin), and each lands on the exhaustive optimum."""
    statuses: dict[str, list[str]] = {"highs": [], "cpsat": []}

    @settings(max_examples=6)
    @given(training_graphs(forward_nodes=4), st.sampled_from([1.0, 1e-3, 1234.567]))
    def check(graph, factor):
        for k, v in enumerate(graph.nodes):  # distinct costs, so the worst incumbent is poor
            graph.nodes[v]["cost"] = (10**6 + 997 * k + 10**8 * graph.nodes[v]["cost"]) * factor
        problem = solver.prepare(graph)
        top = solver.checkpoint_all_peak(problem)
        budgets = (problem.memory_lower_bound, (problem.memory_lower_bound + top) // 2)
        probes_reach_the_optimum(graph, budgets, statuses)

    check()
    assert "INFEASIBLE" in statuses["highs"] and "OPTIMAL" in statuses["highs"]


@pytest.mark.skipif(not VGG19.exists(), reason="the published graphs are not beside the repo")
@pytest.mark.parametrize("factor", [1e-3, 1234.567, 1e4])
def test_a_published_proof_holds_at_other_cost_units(factor):
    """VGG19 at 80% is proven optimal by the moment relaxation and CP-SAT: with its costs in
    another unit the same proof closes the search (it ran to the time limit when CP-SAT's
    integer bounds took a relative margin)."""
    graph = load_graph(VGG19)
    reference = solver.solve(graph, "80%", time_limit=TIME_LIMIT)
    for v in graph.nodes:
        graph.nodes[v]["cost"] *= factor
    schedule = solver.solve(graph, "80%", time_limit=TIME_LIMIT)
    assert reference.status == schedule.status == "OPTIMAL"
    assert schedule.cost == pytest.approx(reference.cost * factor, rel=1e-9)


def _search(graph, budget: int, report=None) -> Search:
    problem = solver.prepare(graph)
    goal = Goal("cost", CostUnits.of(problem), budget=budget)
    started = time.perf_counter()
    deadline = Deadline(started + TIME_LIMIT)
    return Search(graph, problem, goal, SolveOptions(), 8, deadline, TIME_LIMIT, started, report)


def test_concurrent_offers_keep_the_best():
    """Two threads offering the same schedules in opposite orders, switching as often as the
    interpreter allows: the incumbent ends as the best of them, and every value it took (read
    under the search's lock, in the order the lock was taken) only improved."""
    graph = residual_demo(4)
    problem = solver.prepare(graph)
    members = all_policies(problem, each_use=True)
    budget = max(m.schedule.peak for m in members)
    history: list[int] = []
    search = _search(graph, budget)

    def record(*_: float) -> None:
        with search.lock:
            history.append(search.value)

    search.report = record
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            search.incumbent, search.floor = None, 0
            threads = [
                threading.Thread(target=lambda ms=ms: [search.offer(m) for m in ms])
                for ms in (members, members[::-1])
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            best = min(search.goal.key(m) for m in members)
            assert search.goal.key(search.incumbent) == best
    finally:
        sys.setswitchinterval(switching)
    assert history


def test_the_relaxation_beside_the_warm_starts_never_regresses_the_incumbent():
    """The moment relaxation (CP-SAT, on a second thread) and the pending warm starts (on this
    one) both offer schedules and raise the floor: read under the lock, the incumbent's value
    only falls, the floor only rises, and the floor never passes the incumbent."""
    graph = residual_demo(6)
    problem = solver.prepare(graph)
    budget = (problem.memory_lower_bound + solver.checkpoint_all_peak(problem)) // 2
    states: list[tuple[float, int]] = []
    search = _search(graph, budget)

    def record(*_: float) -> None:
        with search.lock:
            states.append((math.inf if search.value is None else search.value, search.floor))

    search.report = record
    search = warm_start.begin(search)
    plans = [m for m in all_policies(problem, each_use=True) if m.schedule.peak <= budget]
    assert plans
    for k, member in enumerate(plans):
        search.defer(f"plan {k}", lambda member=member: [member])
    search.incumbent = None  # the warm starts and the relaxation race for the first incumbent
    search.beside(lambda: relax(search, search.first_tight))
    assert states and not search.pending
    values = [v for v, _ in states]
    floors = [f for _, f in states]
    assert values == sorted(values, reverse=True)
    assert floors == sorted(floors)
    assert all(f <= v for v, f in states)
