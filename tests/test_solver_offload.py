"""Offload (docs/offload.md): the simulator's timeline, the schedule file, and the exact solver
against the exhaustive reference of the stage space with offload."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offload_reference import crossing_copies, offload_min_cost
from ortools.sat.python import cp_model
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import training_graphs

import solver
from cli.main import main
from cli.solve import parse_link
from solver import Link
from solver.core.link import LinkError
from solver.core.offload import OffloadPlan, offload_ops
from solver.core.stages import StagePlan, plan_from_keep
from solver.deadline import NEVER, Deadline
from solver.exact.offload.search import OffloadProblem, solve_with_offload
from solver.examples import chain, uniform_training_chain
from solver.heuristics.offload import offload_runs
from solver.io import save_graph
from solver.milp.offload.model import OffloadModel, variable_count
from solver.milp.offload.times import OffloadTimes
from solver.target.devices import BUILT_IN, HOST_LINKS, Device, UnknownTargetError, builtin_device

TIME_LIMIT = 30.0


def _reduction() -> nx.DiGraph:
    """a (6 B) -> b (1 B) -> c -> e (5 B of workspace) -> d, and d reads b: keeping b through
    e's stage, or recomputing it from a in d's, needs 8 B; offloading it, 7."""
    graph = nx.DiGraph()
    for v, mem, transient in [("a", 6, 0), ("b", 1, 0), ("c", 1, 0), ("e", 1, 5), ("d", 1, 0)]:
        graph.add_node(v, mem=mem, cost=1, transient=transient)
    graph.add_edges_from([("a", "b"), ("b", "c"), ("c", "e"), ("e", "d"), ("b", "d")])
    return graph


REDUCTION_OPS = [
    ("compute", "a"),
    ("compute", "b"),
    ("offload", "b"),  # on the d2h engine from 2 to 3
    ("free", "a"),
    ("compute", "c"),  # 2 to 3
    ("free", "b"),  # its offload has ended at 3: no wait
    ("compute", "e"),  # 3 to 4
    ("free", "c"),
    ("reload", "b"),  # on the h2d engine from 4 to 5
    ("compute", "d"),  # waits for b until 5, then 5 to 6
    ("free", "b"),
    ("free", "e"),
    ("free", "d"),
]


def test_the_timeline_waits_for_reloads_and_counts_the_stall():
    run = solver.simulate(_reduction(), REDUCTION_OPS, Link(1, 1))
    assert run.valid, run.error
    assert (run.cost, run.stall, run.peak, run.host_peak) == (6, 1, 7, 1)
    assert (run.offloads, run.reloads) == (1, 1)
    slower = solver.simulate(_reduction(), REDUCTION_OPS, Link(0.5, 0.5))
    # the offload runs 2 to 4: freeing b after c waits 1; the reload runs 5 to 7: d waits 2
    assert (slower.cost, slower.stall) == (8, 3)


def test_a_source_lives_until_its_copy_ends_and_copies_queue_on_their_engine():
    graph = chain([2, 2, 1], [1, 1, 1])
    ops = [
        ("compute", 0),
        ("offload", 0),  # 1 to 3
        ("compute", 1),  # 1 to 2
        ("offload", 1),  # queued behind 0's: 3 to 5
        ("free", 0),  # waits until 3
        ("compute", 2),  # 3 to 4
        ("free", 1),  # waits until 5
        ("free", 2),
    ]
    run = solver.simulate(graph, ops, Link(1, 1))
    assert run.valid and (run.cost, run.stall) == (5, 2)


def test_each_copy_takes_its_direction_s_latency_besides_its_bytes():
    run = solver.simulate(
        _reduction(), REDUCTION_OPS, Link(1, 1, d2h_latency=0.5, h2d_latency=0.25)
    )
    # b's offload runs 2 to 3.5: freeing b after c waits 0.5, e runs 3.5 to 4.5; the reload
    # runs 4.5 to 5.75: d waits 1.25, then 5.75 to 6.75
    assert run.valid and (run.cost, run.stall) == (6.75, 1.75)


def _crossing_ops() -> tuple[nx.DiGraph, list]:
    """y (2 B) -> x (2 B) -> z, y -> z: y's reload is issued while x's offload runs."""
    graph = nx.DiGraph()
    for v, mem in [("y", 2), ("x", 2), ("z", 1)]:
        graph.add_node(v, mem=mem, cost=1)
    graph.add_edges_from([("y", "x"), ("x", "z"), ("y", "z")])
    ops = [
        ("compute", "y"),  # 0 to 1
        ("offload", "y"),  # 1 to 3
        ("compute", "x"),  # 1 to 2
        ("free", "y"),  # waits until 3
        ("offload", "x"),  # 3 to 5
        ("reload", "y"),  # its own engine: 3 to 5; one shared engine: 5 to 7
        ("compute", "z"),  # waits for y: 5 to 6, or 7 to 8
        ("free", "x"),
        ("free", "y"),
        ("free", "z"),
    ]
    return graph, ops


def test_over_one_shared_engine_a_reload_queues_behind_an_offload():
    graph, ops = _crossing_ops()
    duplex = solver.simulate(graph, ops, Link(1, 1))
    shared = solver.simulate(graph, ops, Link(1, 1, duplex=False))
    assert duplex.valid and (duplex.cost, duplex.stall) == (6, 3)
    assert shared.valid and (shared.cost, shared.stall) == (8, 5)


def test_the_exact_optimum_over_a_shared_engine_equals_the_exhaustive_search():
    """The drawn graphs of the exhaustive test seldom reload while an offload runs; this one's
    optimum does, so the model's shared engine decides its cost."""
    graph = crossing_copies()
    for duplex, cost in [(True, 21), (False, 23)]:
        link = Link(2, 2, duplex=duplex)
        schedule = solver.solve(graph, 9, offload=link, time_limit=TIME_LIMIT)
        assert schedule.status == "OPTIMAL" and schedule.cost == cost == _reference(graph, 9, link)
        assert solver.simulate(graph, schedule.ops, link).cost == cost


def test_a_copy_s_latency_decides_whether_a_value_is_worth_moving():
    """At 8 B the chain recomputes one value (13 units) or moves one over the fast link: with
    no latency the copies hide but for 0.02 units; at 2 units a copy, recomputing is cheaper."""
    graph = uniform_training_chain(4, mem=2)
    assert solver.solve(graph, 8, time_limit=TIME_LIMIT).cost == 13
    costs = {}
    for latency in (0, 0.5, 2):
        link = Link(100, 100, d2h_latency=latency, h2d_latency=latency)
        schedule = solver.solve(graph, 8, offload=link, time_limit=TIME_LIMIT)
        assert schedule.status == "OPTIMAL"
        costs[latency] = (schedule.cost, schedule.extra["offloads"])
    assert costs == {0: (12.02, 1), 0.5: (12.52, 1), 2: (13, 0)}


def test_a_link_without_latency_or_duplex_fields_loads_as_before_and_new_ones_round_trip():
    schedule = solver.solve(_reduction(), 7, offload=Link(1, 1), time_limit=TIME_LIMIT)
    payload = json.loads(schedule.to_json())
    payload["link"] = {"d2h": 1, "h2d": 1, "host_memory": None}  # a file of an older remat
    loaded = solver.Schedule.from_json(json.dumps(payload), _reduction())
    assert loaded.link == Link(1, 1) and loaded.link.d2h_latency == 0 and loaded.link.duplex
    link = Link(1, 2, 9, d2h_latency=0.5, h2d_latency=0.25, duplex=False)
    assert Link.from_json(json.loads(json.dumps(link.to_json()))) == link
    with pytest.raises(LinkError, match="optionally"):
        Link.from_json({"d2h": 1, "h2d": 1, "host_memory": None, "latency": 1})


@pytest.mark.parametrize(
    ("ops", "link", "message"),
    [
        ([("compute", "a"), ("offload", "a")], None, "needs a host link"),
        ([("compute", "a"), ("offload", "a"), ("offload", "a")], Link(1, 1), "a second time"),
        ([("compute", "a"), ("reload", "a")], Link(1, 1), "never offloaded"),
        ([("compute", "a"), ("offload", "a"), ("reload", "a")], Link(1, 1), "already live"),
        ([("offload", "a")], Link(1, 1), "not live"),
        ([("compute", "a"), ("offload", "a")], Link(1, 1, host_memory=5), "over the link's"),
    ],
)
def test_invalid_copies_are_rejected_with_the_reason(ops, link, message):
    run = solver.simulate(_reduction(), ops, link)
    assert not run.valid and message in run.error


def test_host_bytes_are_held_from_the_offload_to_the_last_reload():
    ops = [*REDUCTION_OPS[:-3], ("offload", "d")]  # b's last reload precedes d's offload
    graph = _reduction()
    assert solver.simulate(graph, ops, Link(1, 1)).host_peak == 1
    early = [("compute", "a"), ("compute", "b"), ("offload", "b"), ("offload", "a")]
    assert solver.simulate(graph, early, Link(1, 1)).host_peak == 6  # b's copy was never reloaded
    held = [*early[:2], ("offload", "b"), ("free", "b"), ("offload", "a"), ("reload", "b")]
    assert solver.simulate(graph, held, Link(1, 1)).host_peak == 7


def test_a_host_copy_is_held_until_the_clock_has_waited_for_its_last_reload():
    graph = _reduction()
    reloaded = [*REDUCTION_OPS[:9], ("offload", "e")]  # b's reload is in flight
    assert solver.simulate(graph, reloaded, Link(1, 1)).host_peak == 2
    read = [*REDUCTION_OPS[:10], ("offload", "d")]  # d read b: the clock waited for its reload
    assert solver.simulate(graph, read, Link(1, 1)).host_peak == 1
    freed = [*REDUCTION_OPS[:9], ("free", "b"), ("offload", "e")]  # its free waited too
    assert solver.simulate(graph, freed, Link(1, 1)).host_peak == 1
    limited = solver.simulate(graph, reloaded, Link(1, 1, host_memory=1))
    assert not limited.valid and "over the link's host_memory of 1" in limited.error


def test_host_bytes_are_rounded_as_the_link_s_host_allocator_rounds():
    mib = 1 << 20
    graph = chain([3 * mib, mib, 0], [1, 1, 1])
    ops = [("compute", 0), ("offload", 0), ("compute", 1), ("offload", 1), ("offload", 2)]
    assert solver.simulate(graph, ops, Link(1, 1)).host_peak == 3 * mib
    pinned = Link(1, 1, host_rounding="power-of-two")
    assert solver.simulate(graph, ops, pinned).host_peak == 4 * mib  # 3 MiB takes 4 MiB
    assert [pinned.host_bytes(b) for b in (0, 1, 3, 4, 5, 3 * mib)] == [0, 1, 4, 4, 8, 4 * mib]
    with pytest.raises(LinkError, match="host_rounding must be one of exact, power-of-two"):
        Link(1, 1, host_rounding="pages")
    assert Link.from_json(pinned.to_json()) == pinned
    assert Link.from_json({"d2h": 1, "h2d": 1, "host_memory": None}) == Link(1, 1)


def test_offload_makes_a_budget_below_the_keep_recompute_least_feasible(tmp_path, capsys):
    graph = _reduction()
    with pytest.raises(solver.InfeasibleBudgetError):
        solver.solve(graph, 7, time_limit=TIME_LIMIT)
    schedule = solver.solve(graph, 7, offload=Link(1, 1), time_limit=TIME_LIMIT)
    assert schedule.status == "OPTIMAL" and schedule.peak <= 7
    assert schedule.cost == 6 == offload_min_cost(graph, 7, 1, 1)
    assert schedule.extra["stall"] == 1 and schedule.extra["offloads"] == 1
    path = tmp_path / "s.json"
    schedule.save(path)
    loaded = solver.Schedule.load(path, graph)
    assert loaded.link == Link(1, 1) and loaded.ops == schedule.ops and loaded.cost == 6
    save_graph(graph, tmp_path / "g.json")
    code = main(["solve", str(tmp_path / "g.json"), "--budget", "7", "--offload", "1e-9,1e-9"])
    table = capsys.readouterr().out
    assert code == 0
    assert "INFEASIBLE" in table.split("exact + offload")[0]  # the keep/recompute row
    assert re.search(r"exact \+ offload +6 ", table)


def test_remat_solve_offload_runs_the_librarys_one_orchestration(tmp_path, monkeypatch, capsys):
    """`remat solve --offload` solves keep/recompute once, inside `solve_with_offload` (its
    `keep_recompute_first`), and prints that solve's row: where it finds no schedule, the
    offload solve does not solve it again."""
    import cli.solve

    graph = _reduction()
    save_graph(graph, tmp_path / "g.json")
    budgets: list[object] = []
    solve = cli.solve.solve

    def counted(graph, budget=None, **kwargs):
        budgets.append(budget)
        return solve(graph, budget, **kwargs)

    monkeypatch.setattr(cli.solve, "solve", counted)
    argv = ["solve", str(tmp_path / "g.json"), "--budget", "7", "--offload", "1e-9,1e-9"]
    assert main([*argv, "--quiet", "--no-baselines"]) == 0
    assert budgets == [7]  # the keep/recompute solve, once (INFEASIBLE)
    table = capsys.readouterr().out
    assert "keep/recompute: no schedule fits" in table
    assert re.search(r"^exact +- +- +- +INFEASIBLE", table, re.MULTILINE)
    problem = solver.prepare(graph)
    solved = solve_with_offload(
        OffloadProblem(graph, problem, 7, Link(1, 1)),
        Deadline.after(TIME_LIMIT),
        keep_recompute=solver.solve,
        keep_recompute_first=True,
    )
    assert solved.keep_recompute is None and solved.schedule.cost == 6
    assert isinstance(solved.keep_recompute_error, solver.InfeasibleBudgetError)
    roomy = solve_with_offload(
        OffloadProblem(graph, problem, 100, Link(1, 1)),
        Deadline.after(TIME_LIMIT),
        keep_recompute=solver.solve,
        keep_recompute_first=True,
    )
    assert roomy.keep_recompute is not None and roomy.keep_recompute.status == "OPTIMAL"
    assert roomy.keep_recompute_error is None


REDUCTION_STEPS = {
    100: ["checkpoint-all"],
    7: [
        "checkpoint-all",
        "offload heuristics from checkpoint-all",
        "keep/recompute",
        "offload model",
    ],
}
"""The steps of the offload solves of `_reduction` by budget: at 100 B checkpoint-all fits; at
7 B no keep/recompute schedule fits, and the offload model proves the optimum."""


@pytest.mark.parametrize("budget", sorted(REDUCTION_STEPS))
def test_offload_schedules_list_their_steps_and_whether_interrupted(tmp_path, budget):
    """As every exact schedule: `extra["steps"]` and `extra["interrupted"]`, in the file too."""
    graph = _reduction()
    schedule = solver.solve(graph, budget, offload=Link(1, 1), time_limit=TIME_LIMIT)
    steps = schedule.extra["steps"]
    assert [step["step"] for step in steps] == REDUCTION_STEPS[budget]
    assert schedule.extra["interrupted"] is False and all(step["seconds"] >= 0 for step in steps)
    assert steps[0]["fits"] is (budget == 100)
    if budget == 7:
        assert steps[2]["found"] == "InfeasibleBudgetError" and steps[3]["status"] == "OPTIMAL"
    schedule.save(tmp_path / "s.json")
    loaded = solver.Schedule.load(tmp_path / "s.json", graph)
    assert loaded.extra["steps"] == steps and loaded.extra["interrupted"] is False


@pytest.mark.parametrize("read_by_2", [False, True])
def test_the_step_waits_where_a_source_is_freed_before_its_copy_ends(read_by_2):
    """Node 0 (4 B, cost 5) is offloaded at 5 over a d2h of 1 B per unit (4 units: until 9);
    d's stage 3 has no room for it (4 B of workspace), so it is dropped in stage 2, held to the
    stage's end unread or freed after 2 reads it: the clock waits there until 9, not only at the
    reload (5 + 1 + 1 computed, a wait of 2, 3, the reload 0.5, 4: 11.5)."""
    graph = chain([4, 1, 1, 1, 1], [5, 1, 1, 1, 1])
    graph.add_edge(0, 4)
    if read_by_2:
        graph.add_edge(0, 2)
    graph.nodes[3]["transient"] = 4
    schedule = solver.solve(graph, 6, offload=Link(1, 8), time_limit=TIME_LIMIT)
    assert schedule.status == "OPTIMAL" and schedule.cost == 11.5
    assert offload_min_cost(graph, 6, 1, 8) == 11.5


def test_no_link_is_todays_solver_and_a_link_too_slow_to_pay_changes_nothing():
    graph = uniform_training_chain(3, mem=2)
    graph.nodes[0]["cost"] = 3
    frontier = stage_space_frontier(graph)
    problem = solver.prepare(graph)
    for budget in range(problem.memory_lower_bound, solver.checkpoint_all_peak(problem) + 1):
        expected = min_cost_within(frontier, budget)
        if expected is None:
            continue
        plain = solver.solve(graph, budget, time_limit=TIME_LIMIT)
        assert solver.solve(graph, budget, offload=None, time_limit=TIME_LIMIT).ops == plain.ops
        slow = solver.solve(graph, budget, offload=Link(1e-3, 1e-3), time_limit=TIME_LIMIT)
        assert slow.status == "OPTIMAL" and slow.cost == plain.cost == expected
        assert slow.extra["offloads"] == 0 and slow.link == Link(1e-3, 1e-3)


@st.composite
def held_dags(draw) -> nx.DiGraph:
    """Chains of 4-5 nodes whose last node also reads an early one (the value held or copied
    across the stages between), a few more forward edges, transient bytes on about half the
    nodes: graphs whose checkpoint-all peak is above the one-line floor, where the choices
    matter. Drawn from one seeded generator (varied sizes even derandomized)."""
    rng = draw(st.randoms(use_true_random=False))
    n = rng.randint(4, 5)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((i, i + 1) for i in range(n - 1))
    source = rng.randint(0, n - 3)
    graph.add_edge(source, n - 1)
    graph.add_edges_from((i, j) for i in range(n) for j in range(i + 2, n) if rng.random() < 0.2)
    for v in range(n):
        graph.nodes[v]["mem"] = rng.randint(1, 8) if v == source else rng.randint(0, 6)
        graph.nodes[v]["cost"] = rng.randint(1, 4)
        if rng.random() < 0.5:
            graph.nodes[v]["transient"] = rng.randint(0, 6)
    return graph


latencies = st.sampled_from([0, 0.5, 2])
links = st.builds(
    Link,
    st.sampled_from([1, 2, 8]),
    st.sampled_from([0.5, 1, 4, 8]),
    st.one_of(st.none(), st.integers(min_value=0, max_value=8)),
    latencies,
    latencies,
    st.booleans(),
    st.sampled_from(["exact", "power-of-two"]),
)
"""Links of every kind: bandwidths, a host limit or none, a latency per direction (0 for some),
one engine per direction or one shared, host bytes exact or rounded to powers of two."""


def _reference(graph: nx.DiGraph, budget: int, link: Link) -> float | None:
    """`offload_min_cost` over `link`."""
    latency = (link.d2h_latency, link.h2d_latency)
    return offload_min_cost(
        graph,
        budget,
        link.d2h,
        link.h2d,
        link.host_memory,
        _rounded(link.host_rounding),
        latency,
        link.duplex,
    )


def _rounded(rounding: str):
    """The oracle's host bytes of a copy of n bytes, written here without the package's code."""
    if rounding == "exact":
        return lambda n: n
    return lambda n: 0 if n == 0 else 2 ** math.ceil(math.log2(n))


@settings(max_examples=40)
@given(st.one_of(held_dags(), training_graphs(forward_nodes=2)), links)
def test_the_offload_optimum_equals_the_exhaustive_search(graph, link):
    problem = solver.prepare(graph)
    floor = max(problem.compute_floor(v) for v in range(problem.n))
    top = solver.checkpoint_all_peak(problem)
    for budget in sorted({floor, (floor + top) // 2, top - 1}):
        if budget < floor:
            continue
        expected = _reference(graph, budget, link)
        try:
            schedule = solver.solve(graph, budget, offload=link, time_limit=TIME_LIMIT)
        except solver.InfeasibleBudgetError:
            assert expected is None
            continue
        assert expected is not None, f"{budget}: solver found {schedule.cost}, reference none"
        assert schedule.status == "OPTIMAL" and schedule.cost == pytest.approx(expected)
        check = solver.simulate(graph, schedule.ops, link)
        assert check.valid and check.peak == schedule.peak <= budget
        assert check.cost == pytest.approx(schedule.cost)


def test_schedule_files_of_version_1_and_without_a_version_still_load(tmp_path):
    graph = uniform_training_chain(6)
    schedule = solver.solve(graph, 6, time_limit=TIME_LIMIT)
    payload = json.loads(schedule.to_json())
    del payload["link"]
    for version in (1, None):
        if version is None:
            del payload["version"]
        else:
            payload["version"] = version
        loaded = solver.Schedule.from_json(json.dumps(payload), graph)
        assert loaded.ops == schedule.ops and loaded.link is None
    payload.update(version=1, link=None)
    with pytest.raises(solver.InvalidScheduleError, match="version 1 schedule file has no"):
        solver.Schedule.from_json(json.dumps(payload))
    payload.update(version=3)
    with pytest.raises(solver.InvalidScheduleError, match="version 3 is not supported"):
        solver.Schedule.from_json(json.dumps(payload))
    payload.update(version=2, link={"d2h": -1, "h2d": 1, "host_memory": None})
    with pytest.raises(solver.InvalidScheduleError, match="link d2h must be a finite number"):
        solver.Schedule.from_json(json.dumps(payload))


def test_an_offload_schedule_replayed_without_its_link_is_refused():
    schedule = solver.solve(_reduction(), 7, offload=Link(1, 1), time_limit=TIME_LIMIT)
    payload = json.loads(schedule.to_json())
    payload["link"] = None
    with pytest.raises(solver.InvalidScheduleError, match="needs a host link"):
        solver.Schedule.from_json(json.dumps(payload), _reduction())


def test_links_are_checked_and_every_built_in_target_has_one():
    for bad in (0, -1.0, float("inf"), "1"):
        with pytest.raises(LinkError):
            Link(bad, 1)
    with pytest.raises(LinkError, match="host_memory"):
        Link(1, 1, host_memory=1.5)
    for bad in (-1e-6, float("nan"), True):
        with pytest.raises(LinkError, match="latency must be a finite number"):
            Link(1, 1, h2d_latency=bad)
    with pytest.raises(LinkError, match="duplex must be True or False"):
        Link(1, 1, duplex=1)
    assert all(device.host_link is not None for device in BUILT_IN.values())
    pcie5 = Link(64e9, 64e9, d2h_latency=5e-6, h2d_latency=5e-6, host_rounding="power-of-two")
    assert builtin_device("h100").host_link == HOST_LINKS["pcie5"] == pcie5
    assert builtin_device("a100").host_link == HOST_LINKS["pcie4"]
    device = builtin_device("h100")
    assert Device.from_json(device.to_json()).host_link == device.host_link
    assert parse_link("c2c") == Link(
        450e9, 450e9, d2h_latency=5e-6, h2d_latency=5e-6, host_rounding="power-of-two"
    )
    assert parse_link("a100-40gb") == HOST_LINKS["pcie4"]
    assert parse_link("25, 20, 64GiB") == Link(25e9, 20e9, 64 << 30)
    with pytest.raises(LinkError, match="expected D2H,H2D"):
        parse_link("1,2,3,4")


def test_offload_is_for_the_cost_objective_at_a_budget():
    with pytest.raises(ValueError, match="offload is for objective 'cost'"):
        solver.solve(_reduction(), offload=Link(1, 1))
    with pytest.raises(solver.InfeasibleBudgetError, match="with offload or without"):
        solver.solve(_reduction(), 6, offload=Link(1, 1))


@pytest.mark.parametrize(
    "options",
    [
        solver.SolveOptions(),  # 36,803 variables: too many for the second left, not built
        solver.SolveOptions(model_variables_per_second=10**9),  # attempted: overrun too long
    ],
)
def test_the_offload_solve_keeps_its_time_limit_where_the_model_would_overrun(options):
    graph = uniform_training_chain(40 if options.model_variables_per_second < 10**9 else 80)
    problem = solver.prepare(graph)
    began = time.perf_counter()
    slow = Link(0.01, 0.01)  # no copy pays: the heuristics do not close the search
    schedule = solver.solve(graph, 21, offload=slow, time_limit=1.0, options=options)
    assert time.perf_counter() - began <= 1.0 * 1.05 + 0.5
    assert schedule.status == "FEASIBLE" and schedule.peak <= 21
    assert schedule.bound == problem.total_cost <= schedule.cost


def test_the_offload_model_is_counted_as_built():
    for graph in (uniform_training_chain(5), _reduction()):
        problem = solver.prepare(graph)
        for link in (Link(1, 1), Link(1, 1, host_memory=4)):
            times = OffloadTimes.of(problem, link)
            model = OffloadModel(problem, 10, link, times, None, NEVER)
            assert variable_count(problem, link) == len(model.m.proto.variables)


def test_solve_takes_a_link_or_target_name_and_refuses_anything_else_in_one_line():
    graph = _reduction()
    named = solver.solve(graph, 7, offload="pcie5", time_limit=TIME_LIMIT)
    assert named.link == HOST_LINKS["pcie5"] == solver.solve(graph, 7, offload="H100").link
    with pytest.raises(LinkError, match=r"a solver.Link or the name .*not 64"):
        solver.solve(graph, 7, offload=64, time_limit=TIME_LIMIT)
    with pytest.raises(UnknownTargetError, match="or a host link: pcie5"):
        solver.solve(graph, 7, offload="pcie9", time_limit=TIME_LIMIT)


def _model_time(problem, link: Link, plan, budget: int) -> float | None:
    """The least T of the offload model with every choice fixed to `plan`'s (graph units), or
    None where the model refutes the plan within `budget` bytes."""
    times = OffloadTimes.of(problem, link)
    model = OffloadModel(problem, budget, link, times, None, NEVER)
    model.hint(plan)
    proto = model.m.proto
    for var, value in zip(proto.solution_hint.vars, proto.solution_hint.values, strict=True):
        domain = proto.variables[var].domain
        domain[0], domain[1] = value, value
    engine = cp_model.CpSolver()
    engine.parameters.num_workers = 1
    if engine.solve(model.m) != cp_model.OPTIMAL:
        return None
    return times.units.to_graph(engine.objective_value)


@settings(max_examples=15)
@given(st.one_of(held_dags(), training_graphs(forward_nodes=2)), links)
def test_offload_heuristics_are_plans_of_the_space_never_below_the_exhaustive_optimum(graph, link):
    problem = solver.prepare(graph)
    floor = max(problem.compute_floor(v) for v in range(problem.n))
    top = solver.checkpoint_all_peak(problem)
    bases = {"checkpoint-all": plan_from_keep(problem, range(problem.n))}
    for budget in sorted({floor, (floor + top) // 2, top - 1}):
        if budget < floor:
            continue
        optimum = _reference(graph, budget, link)
        for run in offload_runs(graph, problem, budget, link, bases):
            assert run.valid or link.host_memory is not None, (
                run.param
            )  # only a host limit refuses one
            if not run.valid:
                continue
            # the model's timeline and memory of the plan are the simulator's
            assert _model_time(problem, link, run.plan, run.peak) == pytest.approx(run.cost)
            if run.fits(budget):
                assert optimum is not None and run.cost >= optimum - 1e-9, run.param


@settings(max_examples=15)
@given(st.one_of(held_dags(), training_graphs(forward_nodes=2)), links)
def test_the_model_s_host_rows_hold_a_plan_exactly_at_the_simulated_host_peak(graph, link):
    problem = solver.prepare(graph)
    bases = {"checkpoint-all": plan_from_keep(problem, range(problem.n))}
    unlimited = dataclasses.replace(link, host_memory=None)
    budget = solver.checkpoint_all_peak(problem)
    for run in offload_runs(graph, problem, budget, unlimited, bases):
        peak = solver.simulate(graph, offload_ops(problem, run.plan), unlimited).host_peak
        at_peak = dataclasses.replace(link, host_memory=peak)
        assert _model_time(problem, at_peak, run.plan, budget) == pytest.approx(run.cost)
        if peak > 0:
            below = dataclasses.replace(link, host_memory=peak - 1)
            assert _model_time(problem, below, run.plan, budget) is None, run.param


def test_a_prefetched_reload_holds_its_host_copy_in_the_model_as_in_the_simulator():
    """0 -> 1 -> 2 -> 3 -> 4, 3 reads 0 and 4 reads 2, 1 B each: stage 2 prefetches 0 (read
    in stage 3) and offloads 2, so 0's host copy is held at 2's offload: 2 B on the host."""
    graph = chain([1] * 5, [1] * 5)
    graph.add_edges_from([(0, 3), (2, 4)])
    problem = solver.prepare(graph)
    empty = frozenset()
    stages = StagePlan(
        tuple((t,) for t in range(5)),
        (empty, frozenset({0}), frozenset({1}), frozenset({0, 2}), frozenset({3}), empty),
    )
    plan = OffloadPlan(stages, (empty, empty, frozenset({0}), empty, frozenset({2})), {0, 2})
    ops = offload_ops(problem, plan)
    run = solver.simulate(graph, ops, Link(1, 1))
    assert run.valid and run.host_peak == 2, run.error
    assert not solver.simulate(graph, ops, Link(1, 1, host_memory=1)).valid
    assert _model_time(problem, Link(1, 1, 2), plan, run.peak) == pytest.approx(run.cost)
    assert _model_time(problem, Link(1, 1, 1), plan, run.peak) is None


def test_rounded_times_move_a_plan_s_timeline_by_at_most_their_rounding():
    """`OffloadTimes.rounding` (graph units) bounds how far the model's T of a plan, over times
    rounded to whole units, is from the simulator's cost of it; 0 where the times are exact."""
    graph = uniform_training_chain(5)
    assert OffloadTimes.of(solver.prepare(graph), Link(1, 1)).rounding == 0
    for v in graph.nodes:
        graph.nodes[v]["cost"] /= 3  # no power of ten makes these whole
    problem, link = solver.prepare(graph), Link(0.7, 0.7)
    times = OffloadTimes.of(problem, link)
    assert not times.exact and times.rounding > 0
    bases = {"checkpoint-all": plan_from_keep(problem, range(problem.n))}
    budget = problem.one_line_floor
    runs = [run for run in offload_runs(graph, problem, budget, link, bases) if run.valid]
    assert runs
    for run in runs:
        model = _model_time(problem, link, run.plan, run.peak)
        assert model is not None and abs(model - run.cost) <= times.rounding


def test_a_heuristic_at_the_compute_cost_closes_the_offload_search_at_once():
    graph = uniform_training_chain(40)  # 36,803 model variables: none built
    schedule = solver.solve(graph, 10, offload=Link(1, 1), time_limit=TIME_LIMIT)
    assert schedule.status == "OPTIMAL" and schedule.peak <= 10
    assert schedule.cost == solver.prepare(graph).total_cost and schedule.extra["offloads"] > 0
    assert schedule.extra["found_by"].startswith("offload")
    assert solver.simulate(graph, schedule.ops, Link(1, 1)).cost == schedule.cost


def test_the_offload_solve_returns_no_worse_than_every_heuristic_that_fits():
    graph = uniform_training_chain(30)
    problem, link, budget = solver.prepare(graph), Link(0.5, 0.5), 12
    bases = {"checkpoint-all": plan_from_keep(problem, range(problem.n))}
    runs = offload_runs(graph, problem, budget, link, bases)
    fitting = [run.cost for run in runs if run.fits(budget)]
    assert fitting and min(fitting) > problem.total_cost  # copies stall: no proof at once
    no_model = solver.SolveOptions(model_variables_per_second=1)
    schedule = solver.solve(graph, budget, offload=link, time_limit=5.0, options=no_model)
    assert schedule.status == "FEASIBLE" and schedule.peak <= budget
    assert schedule.cost <= min(fitting) and schedule.bound == problem.total_cost


def test_with_no_time_left_or_too_large_a_model_the_incumbent_comes_back():
    """A deadline already passed ends in SolverTimeoutError where nothing was found (not an
    error of the time limit's), and returns the caller's keep/recompute schedule where there is
    one; a model over `max_model_variables` is not built: the keep/recompute schedule comes back
    "FEASIBLE", bounded by the cost of computing every node once, saying why."""
    graph = uniform_training_chain(6)  # 12 nodes: the keep/recompute solves close at once
    problem = solver.prepare(graph)
    budget = solver.baseline(graph, "checkpoint_all").peak - 1
    slow = Link(0.01, 0.01)  # no copy pays: the heuristics do not close the search
    with pytest.raises(solver.SolverTimeoutError, match="with offload or without"):
        solve_with_offload(OffloadProblem(graph, problem, budget, slow), Deadline.after(0))
    start = solver.solve(graph, budget, time_limit=TIME_LIMIT)
    asked = OffloadProblem(graph, problem, budget, slow)
    late = solve_with_offload(asked, Deadline.after(0), start=start).schedule
    assert late.ops == start.ops and late.status == "FEASIBLE"
    assert late.bound == problem.total_cost == 18
    assert "too many for the 0.0 s left" in late.extra["offload_model"]
    small = solver.SolveOptions(max_model_variables=10)
    unbuilt = solver.solve(graph, budget, offload=slow, time_limit=TIME_LIMIT, options=small)
    assert unbuilt.status == "FEASIBLE" and unbuilt.extra["offloads"] == 0
    assert unbuilt.cost == start.cost and unbuilt.bound == 18
    why = unbuilt.extra["offload_model"]
    assert "more than 10 variables (SolveOptions.max_model_variables" in why
