"""Rotor-style dynamic program on chains: valid schedules, never worse than the checkpoint
baselines, equal to the exact solver where the two schedule spaces agree."""

from __future__ import annotations

import networkx as nx
import pytest

import solver
from solver.core.stages import cheapest_within
from solver.examples import chain, residual_demo, training_graph, uniform_training_chain
from solver.heuristics.baselines import BASELINES
from solver.heuristics.rotor import NotAChainError, rotor

HETEROGENEOUS = [
    ([3, 1, 4, 1, 5], [2, 7, 1, 8, 2]),
    ([2, 2, 1, 3, 1, 2], [1, 1, 5, 2, 3, 1]),
    ([1, 4, 2, 2, 3], [4, 1, 1, 3, 2]),
]


def _graphs() -> list[nx.DiGraph]:
    graphs = [uniform_training_chain(n) for n in (5, 8)]
    graphs += [training_graph(chain(m, c)) for m, c in HETEROGENEOUS]
    return graphs


@pytest.mark.parametrize("graph", _graphs())
def test_every_member_passes_the_simulator(graph: nx.DiGraph) -> None:
    problem = solver.prepare(graph)
    for member in rotor(problem):
        sim = solver.simulate(graph, [(k, problem.ids[i]) for k, i in member.schedule.ops])
        sim.raise_if_invalid()
        assert sim.peak == member.schedule.peak
        assert sim.cost == pytest.approx(member.schedule.cost)


@pytest.mark.parametrize("n", [16, 48])
@pytest.mark.parametrize("name", ["sqrt_segments", "every_k", "chen_greedy", "checkpoint_all"])
def test_never_worse_than_checkpoint_baselines_on_uniform_chains(n: int, name: str) -> None:
    problem = solver.prepare(uniform_training_chain(n))
    family = rotor(problem)
    for member in BASELINES[name](problem):
        best = cheapest_within(family, member.schedule.peak)
        assert best is not None
        assert best.schedule.cost <= member.schedule.cost


@pytest.mark.parametrize("graph", _graphs())
def test_equal_to_exact_where_persistent_checkpoints_are_optimal(graph: nx.DiGraph) -> None:
    """Rotor's schedules lie in the stage space, so exact <= rotor at every budget. They are
    equal on these chains at every budget except where the exact schedule frees a segment's
    input checkpoint after recomputing its successor (see the next test)."""
    problem = solver.prepare(graph)
    family = rotor(problem)
    peak = solver.checkpoint_all_peak(problem)
    for budget in range(problem.memory_lower_bound, peak + 1):
        best = cheapest_within(family, budget)
        exact = solver.solve(graph, budget, time_limit=30)
        assert exact.status == "OPTIMAL"
        assert best is not None and best.schedule.cost == pytest.approx(exact.cost)


@pytest.mark.parametrize("transients", [[0, 5, 0, 2, 0], [3, 0, 4, 0, 1]])
def test_with_transient_bytes_members_pass_the_simulator_and_exact_is_no_worse(transients):
    """Transient bytes on forward and gradient nodes: every member's peak (transients
    included) is the simulator's, and at every budget the exact optimum is at most rotor's."""
    graph = training_graph(chain([3, 1, 4, 1, 5], [2, 7, 1, 8, 2]))
    for v, extra in zip(range(5), transients, strict=True):
        graph.nodes[v]["transient"] = extra
        graph.nodes[f"d{v}"]["transient"] = extra // 2
    problem = solver.prepare(graph)
    family = rotor(problem)
    for member in family:
        sim = solver.simulate(graph, [(k, problem.ids[i]) for k, i in member.schedule.ops])
        sim.raise_if_invalid()
        assert sim.peak == member.schedule.peak
    peak = solver.checkpoint_all_peak(problem)
    for budget in range(problem.memory_lower_bound, peak + 1, 2):
        best = cheapest_within(family, budget)
        try:
            exact = solver.solve(graph, budget, time_limit=30)
        except solver.InfeasibleBudgetError:
            assert best is None
            continue
        assert exact.status == "OPTIMAL" and exact.peak <= budget
        assert best is None or exact.cost <= best.schedule.cost + 1e-9


def test_where_the_models_differ_exact_drops_a_checkpoint() -> None:
    """mems [1, 1, 4, 2, 4], costs [1, 5, 2, 4, 4] at 12 bytes: the exact schedule recomputes
    f2 from the checkpoint f1, frees f1 before d3 and recomputes f0, f1 for d2 (56); rotor keeps
    a segment's input checkpoint until the segment's backward is done (62)."""
    graph = training_graph(chain([1, 1, 4, 2, 4], [1, 5, 2, 4, 4]))
    exact = solver.solve(graph, 12, time_limit=30)
    ours = solver.baseline(graph, "rotor", 12)
    assert exact.cost == 56 and ours is not None and ours.cost == 62


def test_uniform_chain_reaches_the_memory_lower_bound() -> None:
    problem = solver.prepare(uniform_training_chain(8))
    assert min(m.schedule.peak for m in rotor(problem)) == problem.memory_lower_bound


def test_not_a_chain_raises() -> None:
    with pytest.raises(NotAChainError):
        rotor(solver.prepare(residual_demo()))
    with pytest.raises(NotAChainError):
        rotor(solver.prepare(chain([1, 1], [1, 1])))


def test_a_loss_no_backward_node_reads_is_refused_not_skipped():
    """A captured loss (mean) whose gradient ignores its value: rotor's program would never
    compute it, so rotor must refuse the graph and the exact solver must still be valid."""
    graph = training_graph(chain([1] * 6, [1] * 6))
    graph.remove_edge(5, "d5")
    with pytest.raises(NotAChainError, match="uncomputed"):
        rotor(solver.prepare(graph))
    schedule = solver.solve(graph, 5, time_limit=20)
    assert solver.simulate(graph, schedule.ops).valid
