"""The simulator's semantics, the schedule file and the errors of the solver interface."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import networkx as nx
import pytest
from solver_checks import NO_COVER
from solver_strategies import uniform_chain

import solver
from solver import SolveOptions
from solver.core.budget import CHECKPOINT_ALL, PLAIN_STEP, as_percent
from solver.deadline import Deadline
from solver.exact import least_peak, warm_start
from solver.exact.state import run_steps
from solver.examples import chain, residual_demo, training_graph, uniform_training_chain
from solver.heuristics.eviction import eviction_runs
from solver.io import graph_from_node_link, load_graph, save_graph
from solver.milp.cpsat import CpSatModel
from solver.milp.formulation import build
from solver.milp.lp import solve_relaxation
from solver.milp.units import CostUnits


def _diamond() -> nx.DiGraph:
    g = nx.DiGraph()
    for v, m in zip("abcd", (1, 2, 4, 8), strict=True):
        g.add_node(v, mem=m, cost=1)
    g.add_edges_from([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    return g


DIAMOND_OPS = [
    ("compute", "a"),
    ("compute", "b"),
    ("compute", "c"),
    ("free", "a"),
    ("compute", "d"),
    ("free", "b"),
    ("free", "c"),
]
"""Every node of `_diamond` once, each freed after its last user."""


def test_peak_counts_the_new_value_and_its_live_inputs():
    result = solver.simulate(_diamond(), DIAMOND_OPS)
    assert result.valid and result.peak == 2 + 4 + 8 and result.cost == 4


def test_peak_adds_the_computed_ops_transient_bytes():
    """c holds 16 transient bytes while it runs (a workspace): the peak at its compute is a, b,
    c and those 16; d's 3 transient bytes add to 14 at its compute; a missing `transient` is 0."""
    graph = _diamond()
    graph.nodes["c"]["transient"] = 16
    graph.nodes["d"]["transient"] = 3
    result = solver.simulate(graph, DIAMOND_OPS)
    assert result.valid and result.peak == 1 + 2 + 4 + 16
    problem = solver.prepare(graph)
    assert problem.transient == (0, 0, 16, 3)
    assert problem.memory_lower_bound == 4 + 1 + 16  # c, its input a and its workspace
    assert solver.checkpoint_all_peak(problem) == result.peak
    schedule = solver.solve(graph, result.peak, time_limit=10)
    assert schedule.status == "OPTIMAL" and schedule.peak == result.peak


def test_transient_bytes_are_part_of_the_fingerprint_only_when_given():
    graph = _diamond()
    base = solver.prepare(graph).fingerprint
    graph.nodes["a"]["transient"] = 0
    assert solver.prepare(graph).fingerprint == base
    graph.nodes["a"]["transient"] = 5
    assert solver.prepare(graph).fingerprint != base


def test_recomputation_counts_cost_and_recomputes():
    ops = [
        ("compute", "a"),
        ("compute", "b"),
        ("free", "a"),
        ("compute", "a"),
        ("compute", "c"),
        ("free", "a"),
        ("compute", "d"),
    ]
    result = solver.simulate(_diamond(), ops)
    assert result.valid and result.cost == 5 and result.recomputes == 1


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([("compute", "b")], "needs 'a'"),
        ([("compute", "a"), ("compute", "a")], "already live"),
        ([("free", "a")], "not live"),
        ([("compute", "z")], "unknown node"),
        ([("compute", "a"), ("drop", "a")], "unknown op kind"),
        ([("compute", "a")], "never computed"),
    ],
)
def test_invalid_schedules_are_rejected_with_the_reason(ops, message):
    result = solver.simulate(_diamond(), ops)
    assert not result.valid and message in result.error
    with pytest.raises(solver.InvalidScheduleError, match=message):
        result.raise_if_invalid()


def test_schedule_json_round_trip_and_graph_check(tmp_path):
    graph = uniform_training_chain(6)
    schedule = solver.solve(graph, 6, time_limit=20)
    path = tmp_path / "s.json"
    schedule.save(path)
    loaded = solver.Schedule.load(path, graph)
    assert loaded.ops == schedule.ops and loaded.cost == schedule.cost
    assert loaded.status == "OPTIMAL" and loaded.bound == schedule.bound
    payload = json.loads(path.read_text())
    assert payload["version"] == 2 and payload["link"] is None
    other = uniform_training_chain(7)
    with pytest.raises(solver.ScheduleMismatchError, match="solved for graph"):
        solver.Schedule.load(path, other)


def test_fingerprint_ignores_cost_but_not_bytes():
    graph = uniform_training_chain(4)
    base = solver.prepare(graph).fingerprint
    graph.nodes[0]["cost"] = 7
    assert solver.prepare(graph).fingerprint == base
    graph.nodes[0]["mem"] = 7
    assert solver.prepare(graph).fingerprint != base


def test_cyclic_graph_is_refused():
    g = uniform_chain(3)
    g.add_edge(2, 0)
    with pytest.raises(solver.GraphError, match="cycle"):
        solver.solve(g, 10)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("mem", None, "no 'mem'"),
        ("cost", -1, "negative"),
        ("mem", 1.5, "whole number"),
        ("cost", float("nan"), "finite"),
        ("transient", -2, "negative"),
        ("transient", 0.5, "whole number"),
        ("transient", "big", "not a finite number"),
    ],
)
def test_bad_attributes_are_refused(key, value, message):
    g = uniform_chain(3)
    if value is None:
        del g.nodes[1][key]
    else:
        g.nodes[1][key] = value
    with pytest.raises(solver.GraphError, match=message):
        solver.solve(g, 10)


def test_overhead_is_the_recomputation_over_the_measured_plain_step(tmp_path):
    graph = uniform_chain(4)  # four nodes of cost 1
    assert solver.prepare(graph).step_cost is None
    assert solver.prepare(graph).overhead(6.0) == 0.5  # no measured step: over the node costs
    graph.graph["step_cost"] = 5
    problem = solver.prepare(graph)
    assert problem.step_cost == 5.0
    assert problem.overhead(6.0) == 0.4
    assert problem.overhead(problem.total_cost) == 0.0
    save_graph(graph, tmp_path / "g.json")
    assert solver.prepare(load_graph(tmp_path / "g.json")).step_cost == 5.0


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_a_bad_step_cost_is_refused(value):
    graph = uniform_chain(3)
    graph.graph["step_cost"] = value
    with pytest.raises(solver.GraphError, match="step_cost"):
        solver.prepare(graph)


def test_order_must_be_topological():
    g = uniform_chain(3)
    g.graph["order"] = [1, 0, 2]
    with pytest.raises(solver.GraphError, match="not topological"):
        solver.prepare(g)


def test_impossible_budget_names_the_minimum():
    graph = uniform_training_chain(5)
    least = solver.solve(graph, objective="memory", time_limit=20)
    assert least.status == "OPTIMAL"
    with pytest.raises(
        solver.InfeasibleBudgetError, match=f"minimum feasible budget is {least.peak} bytes"
    ) as info:
        solver.solve(graph, least.peak - 1, time_limit=20)
    assert info.value.minimum_bytes == least.peak
    assert solver.solve(graph, least.peak, time_limit=20).peak <= least.peak


def test_compute_budget_below_total_cost_is_refused():
    with pytest.raises(solver.ComputeBudgetError, match=r"1\.0x"):
        solver.solve(uniform_training_chain(3), objective="memory", compute_budget="0.9x")


def _least_peak_then_heuristics(search):
    """Steps that prove the least peak but search the cost at it by the warm starts alone, as a
    cost search cut short by its deadline would."""
    if search.goal.objective == "memory":
        return run_steps(search, least_peak.STEPS)
    return warm_start.warm_start(search)


@pytest.mark.parametrize("blocks", [3])
def test_min_never_costs_more_than_its_least_peak_schedule(blocks):
    """The budget "min": the cost search at the least peak starts from the least-peak schedule,
    so a search stopped early returns it or better, never a costlier schedule over the compute
    budget (which keeps executor.compile's run-once ops from recomputing)."""
    graph = residual_demo(blocks)
    total = solver.prepare(graph).total_cost
    options = SolveOptions(steps=(_least_peak_then_heuristics,))
    cheapest = solver.solve(graph, "min", compute_budget="1.05x", time_limit=30, options=options)
    least = solver.solve(graph, objective="memory", compute_budget="1.05x", time_limit=30)
    assert cheapest.cost <= 1.05 * total
    assert cheapest.peak == least.peak
    assert cheapest.cost <= least.cost


def test_a_budget_the_objective_would_ignore_is_refused():
    graph = uniform_training_chain(3)
    with pytest.raises(ValueError, match="budget is for objective 'cost'"):
        solver.solve(graph, "80%", objective="memory", time_limit=5)
    with pytest.raises(ValueError, match="compute_budget is for objective 'memory'"):
        solver.solve(graph, "80%", compute_budget="1.2x", time_limit=5)


def test_budget_parsing():
    problem = solver.prepare(uniform_training_chain(4))
    assert solver.parse_budget("1KiB", problem) == 1024
    assert solver.parse_budget("2 MB", problem) == 2_000_000
    assert solver.parse_budget("50%", problem) == solver.checkpoint_all_peak(problem) // 2
    assert solver.parse_compute_budget("1.5x", problem) == 1.5 * problem.total_cost
    with pytest.raises(ValueError, match="cannot read memory budget"):
        solver.parse_budget("lots", problem)
    assert solver.parse_budget("1e3", problem) == solver.parse_budget(1000.0, problem) == 1000
    for fraction in ("0.5", "0.5B", 0.5, float("nan")):  # a share needs "%": never 0 bytes
        with pytest.raises(ValueError, match="not a whole number of bytes"):
            solver.parse_budget(fraction, problem)


def test_saved_graph_loads_back_identically(tmp_path):
    graph = residual_demo(blocks=2)
    save_graph(graph, tmp_path / "g.json")
    loaded = load_graph(tmp_path / "g.json")
    assert solver.prepare(loaded).fingerprint == solver.prepare(graph).fingerprint


def test_random_layered_link_format():
    data = {
        "nodes": [{"id": 0, "out_cost": 3, "duration": 1}, {"id": 1, "out_cost": 2, "duration": 0}],
        "links": [{"0": 0, "1": 1}],
    }
    g = graph_from_node_link(data)
    assert g.nodes[0]["mem"] == 3 and list(g.edges) == [(0, 1)]


def test_graph_without_cost_attributes_is_refused():
    with pytest.raises(solver.GraphError, match="cost_ram"):
        graph_from_node_link({"nodes": [{"id": 0}], "links": []})


def _three_hundred_nodes() -> nx.DiGraph:
    """The training graph of a 150-node chain with some skip edges: its exact model (0.8M
    variables and rows) takes seconds to build and to translate for CP-SAT."""
    rng = random.Random(0)
    forward = chain(
        [rng.randint(1, 9) for _ in range(150)], [rng.randint(1, 5) for _ in range(150)]
    )
    forward.add_edges_from((i, i + 2) for i in range(148) if rng.random() < 0.3)
    return training_graph(forward)


def test_the_time_limit_holds_while_the_model_is_built():
    """A 300-node training graph: building its model alone takes longer than a 1 s limit. The
    build gives up at its deadline, and the best heuristic comes back as FEASIBLE (bound: every
    node once)."""
    graph = _three_hundred_nodes()
    problem = solver.prepare(graph)
    budget = solver.parse_budget("60%", problem)
    with pytest.raises(TimeoutError):
        build(problem, budget, CostUnits.of(problem).int_cost, deadline=Deadline.after(0.05))
    # The cover would prove the best heuristic optimal here before any model.
    schedule = solver.solve(graph, "60%", time_limit=1.0, options=NO_COVER)
    assert schedule.status == "FEASIBLE" and schedule.peak <= schedule.budget
    assert schedule.bound == problem.total_cost


@pytest.mark.parametrize(
    ("budget", "objective"), [("2%", "cost"), ("45%", "cost"), (None, "memory")]
)
def test_a_solve_past_its_deadline_runs_no_step(budget, objective):
    """The promise of `solver.solve` (time_limit * 1.05 + 0.5 s, whatever the outcome) rests on
    the pipeline running no step once the deadline has passed: with a limit that passes during
    the first heuristics (a 300-node graph's policy families do not finish in a millisecond),
    the trace holds no step beyond the first one, whatever the outcome (an infeasible budget
    searches for the least feasible peak in the same time)."""
    graph = _three_hundred_nodes()
    try:
        schedule = solver.solve(graph, budget, objective=objective, time_limit=1e-3)
    except (solver.InfeasibleBudgetError, solver.SolverTimeoutError):
        return
    assert schedule.status == "FEASIBLE"
    assert len(schedule.extra["steps"]) <= 1


def test_cpsat_gives_up_translating_as_soon_as_the_limit_is_out_of_reach():
    """CP-SAT's translation of a 0.8M-item model takes seconds: with a 1 s limit it stops once
    its rate says so, well before the limit, and reports UNKNOWN."""
    problem = solver.prepare(_three_hundred_nodes())
    lm = build(problem, solver.parse_budget("60%", problem), CostUnits.of(problem).int_cost)
    result = CpSatModel(lm).solve(deadline=Deadline.after(1.0), workers=2)
    assert result.status == "UNKNOWN" and result.values is None


def test_a_model_over_the_size_limit_returns_the_best_heuristic_or_says_why():
    """Over `SolveOptions.max_model_variables` the model is not built: the cheapest heuristic
    comes back with the read-gap cover's bound (the trivial bound, every node once, without
    it), and without any heuristic the error names the model's size. (The moment phase and the
    cascade cover, which would raise the bound on this graph, are left out.)"""
    graph = residual_demo(blocks=2)
    problem = solver.prepare(graph)
    budget = solver.parse_budget("60%", problem)
    unit = CostUnits.of(problem).unit
    small = SolveOptions(max_model_variables=10, moment_late_share=2.0, cascade=False)
    schedule = solver.solve(graph, budget, time_limit=10, options=small)
    records = {record["step"]: record for record in schedule.extra["steps"]}
    assert records["stage_model"]["variables"] > 10 and records["lp_relaxation"]["lp_rounds"] == 0
    cover = records["read_gap_cover"]["bound"]
    assert cover > 0 and schedule.status == "FEASIBLE" and schedule.peak <= budget
    assert schedule.bound == pytest.approx(problem.total_cost + cover * unit)
    schedule = solver.solve(graph, budget, time_limit=10, options=replace(small, cover=False))
    assert schedule.status == "FEASIBLE" and schedule.bound == problem.total_cost
    nothing = replace(small, cover=False, warm_starts=())
    with pytest.raises(solver.SolverTimeoutError, match=r"would have more than \d+ variables"):
        solver.solve(graph, budget, time_limit=10, options=nothing)


def test_a_model_too_large_for_the_time_left_is_not_built():
    """Over `SolveOptions.model_variables_per_second` per second left the model is not built
    (its LP would not end in time): the best heuristic comes back within the limit, and
    without one the error says the time left was too short."""
    graph = residual_demo(blocks=2)
    budget = solver.parse_budget("60%", solver.prepare(graph))
    slow = SolveOptions(model_variables_per_second=1, moment_late_share=2.0, cascade=False)
    schedule = solver.solve(graph, budget, time_limit=10, options=slow)
    records = {record["step"]: record for record in schedule.extra["steps"]}
    assert records["lp_relaxation"]["lp_rounds"] == 0 and schedule.peak <= budget
    nothing = replace(slow, cover=False, warm_starts=())
    with pytest.raises(solver.SolverTimeoutError, match=r"too many for the [\d.]+ s left"):
        solver.solve(graph, budget, time_limit=10, options=nothing)


def _eviction_misses_the_least_peak() -> nx.DiGraph:
    """A training graph (7 forward nodes) whose least peak is its one-line bound, 26 bytes,
    where the least peak of the eviction runs and of the least-peak search is 27 bytes."""
    forward = nx.DiGraph()
    for v, (mem, cost) in enumerate([(9, 1), (6, 5), (5, 1), (6, 4), (2, 4), (2, 4), (7, 2)]):
        forward.add_node(v, mem=mem, cost=cost)
    forward.add_edges_from([(0, 1), (1, 2), (2, 3), (2, 5), (3, 4), (4, 5), (4, 6), (5, 6)])
    return training_graph(forward)


def test_where_no_heuristic_fits_the_error_names_the_budget_they_reach():
    """With eviction the only warm start and no model to search, a budget below the least
    peak the heuristics reach gets an error that says what that peak is; a budget at it gets a
    schedule, and the exact search finds the schedules below it."""
    graph = _eviction_misses_the_least_peak()
    assert solver.prepare(graph).memory_lower_bound == 26
    no_model = SolveOptions(
        warm_starts=("eviction",), max_model_variables=10, cascade=False, cover=False
    )
    message = r"heuristics reach is 27 B.*at 27 bytes a heuristic's schedule fits"
    with pytest.raises(solver.SolverTimeoutError, match=message):
        solver.solve(graph, 26, time_limit=10, options=no_model)
    assert solver.solve(graph, 27, time_limit=10, options=no_model).peak <= 27
    assert solver.solve(graph, 26, time_limit=10).peak == 26


def test_every_engine_returns_at_once_past_its_deadline():
    """Each engine a step calls checks its deadline before it works: past it, the model
    is not built, CP-SAT and the LP do not run, and the heuristics offer nothing."""
    graph = residual_demo(blocks=2)
    problem = solver.prepare(graph)
    budget = solver.parse_budget("60%", problem)
    int_cost = CostUnits.of(problem).int_cost
    passed = Deadline(0.0)
    with pytest.raises(TimeoutError):
        build(problem, budget, int_cost, deadline=passed)
    lm = build(problem, budget, int_cost)
    assert CpSatModel(lm).solve(deadline=passed, workers=1).status == "UNKNOWN"
    assert solve_relaxation(lm, passed) is None
    assert eviction_runs(problem, budget, passed) == []


def test_a_percentage_of_a_basis_of_no_bytes_is_named_not_divided():
    assert as_percent(0, 0, CHECKPOINT_ALL) == f"no percentage: {CHECKPOINT_ALL} is 0 bytes"
    assert as_percent(18432, 5824, PLAIN_STEP) == f"316.5% of {PLAIN_STEP}"
