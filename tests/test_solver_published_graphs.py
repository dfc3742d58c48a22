"""Regression: optimal costs on the published Checkmate graphs (skipped when absent).

Budgets are fractions of the checkpoint-all peak, as in the literature. The pinned optima match
those reported for the Checkmate stage space (VGG16 90%: 15805; VGG19: 9503030 / 9754760;
MobileNet: 162345 / 162680; ResNet50: 406110 / 406800).
"""

from __future__ import annotations

import pytest
from solver_checks import GRAPHS, NO_COVER, steps_run

import solver
from solver.io import load_graph


def _graph(name: str):
    path = GRAPHS / f"{name}_train_nx.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    return load_graph(path)


@pytest.mark.parametrize(
    ("name", "budget", "optimum"),
    [
        ("VGG16_256_224x224x3", "90%", 15805),
        ("VGG19_256_224x224x3", "90%", 9503030),
        ("VGG19_256_224x224x3", "80%", 9754760),
        ("VGG19_256_224x224x3", 13153337344, 9757375),  # its least feasible peak
        ("fcn_8_vgg_32_416x608x3", "90%", 10278354943616),
        ("fcn_8_vgg_32_416x608x3", "80%", 10289323652736),
    ],
)
def test_published_optimum_is_reproduced_and_proven(name, budget, optimum):
    graph = _graph(name)
    schedule = solver.solve(graph, budget, time_limit=120)
    assert schedule.status == "OPTIMAL"
    assert schedule.cost == optimum
    assert solver.simulate(graph, schedule.ops).peak <= schedule.budget


@pytest.mark.parametrize(
    ("name", "budget", "optimum"),
    [
        ("MobileNet_512_224x224x3", "90%", 162345),
        ("MobileNet_512_224x224x3", "80%", 162680),
        ("ResNet50_256_224x224x3", "90%", 406110),
        ("ResNet50_256_224x224x3", "80%", 406800),
    ],
)
def test_the_read_gap_cover_proves_the_optimum_without_a_stage_model(name, budget, optimum):
    """The cover's bound is the optimum here and the plan it suggests reaches it: proven in
    no stage model built (see solver.milp.cover)."""
    graph = _graph(name)
    schedule = solver.solve(graph, budget, time_limit=60)
    assert steps_run(schedule) == ["warm_start", "read_gap_cover"]  # then closed
    assert schedule.status == "OPTIMAL" and schedule.cost == optimum
    assert solver.simulate(graph, schedule.ops).peak <= schedule.budget


@pytest.mark.parametrize(
    ("name", "budget", "optimum"),
    [("MobileNet_512_224x224x3", "80%", 162680), ("ResNet50_256_224x224x3", "80%", 406800)],
)
def test_without_the_cover_the_stage_model_proves_the_same_optimum(name, budget, optimum):
    """The stage model's LP, rounding and HiGHS probes alone: a second, independent proof of the
    pinned optima."""
    graph = _graph(name)
    schedule = solver.solve(graph, budget, time_limit=180, options=NO_COVER)
    assert schedule.status == "OPTIMAL" and schedule.cost == optimum


def test_vgg16_at_80_percent_is_refused_by_the_one_line_bound():
    graph = _graph("VGG16_256_224x224x3")
    with pytest.raises(solver.InfeasibleBudgetError) as info:
        solver.solve(graph, "80%", time_limit=60)
    assert info.value.minimum_bytes == solver.prepare(graph).memory_lower_bound


def test_checkmate_attributes_map_onto_mem_and_cost():
    graph = _graph("VGG16_256_224x224x3")
    problem = solver.prepare(graph)
    assert problem.n == 45 and problem.has_phases
    first = graph.nodes[problem.ids[0]]
    assert first["mem"] == first["cost_ram"] and first["cost"] == first["cost_cpu"]


def test_random_layered_graphs_load_with_their_order():
    path = GRAPHS / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    graph = load_graph(path)
    problem = solver.prepare(graph)
    assert problem.n == 100 and problem.ids == tuple(graph.graph["order"])
    assert not problem.has_phases


def test_vgg16_frontier_exact_is_never_above_a_heuristic():
    from benchmarks.frontier_points import frontier

    points = frontier(_graph("VGG16_256_224x224x3"), ["100%", "95%", "90%", "85%"], time_limit=60)
    by_budget: dict[int, dict[str, float | None]] = {}
    for p in points:
        by_budget.setdefault(p.budget, {})[p.method] = p.cost
    for costs in by_budget.values():
        assert "eviction" in costs and "chen_greedy" in costs
        exact = costs.pop("exact")
        assert exact is not None
        assert all(c is None or exact <= c + 1e-9 for c in costs.values()), costs
