"""Per-block checkpointing over the module paths of a captured graph (`module_blocks`): what it
drops, and that the exact search starts no worse than it."""

from __future__ import annotations

import solver
from solver.examples import chain, training_graph
from solver.heuristics.baselines import block_checkpoint, module_blocks


def _two_blocks() -> tuple:
    """A training graph of a 6-node forward chain: a stem, blocks h.0 and h.1 of two nodes each,
    a head; every forward value 4 bytes, cost 1."""
    graph = training_graph(chain([4] * 6, [1] * 6))
    paths = ["stem", "h.0.a", "h.0.b", "h.1.a", "h.1.b", "head"]
    for v, path in zip(range(6), paths, strict=True):
        graph.nodes[v]["module"] = path
    return graph, solver.prepare(graph)


def test_a_block_keeps_its_output_and_recomputes_its_inside():
    graph, problem = _two_blocks()
    block = [m[:3] if m.startswith("h.") else None for m in problem.module]
    member = block_checkpoint(problem, block)
    inside = {problem.index[1], problem.index[3]}  # read only within their block and backward
    computes = [v for op, v in member.schedule.ops if op == "compute"]
    recomputed = {v for v in computes if computes.count(v) > 1}
    assert recomputed == inside  # each once more, for the backward
    assert member.schedule.cost == problem.total_cost + len(inside)
    assert solver.simulate(graph, [(op, problem.ids[v]) for op, v in member.schedule.ops]).valid


def test_members_sweep_depths_and_checkpoint_the_first_blocks_first():
    _, problem = _two_blocks()
    params = [m.param for m in module_blocks(problem)]
    assert params[:3] == ["depth=1,k=3", "depth=2,k=2", "depth=3,k=4"]  # all blocks first
    assert "depth=2,k=1" in params  # then h.1, the last block, left whole
    cost = {m.param: m.schedule.cost for m in module_blocks(problem)}
    assert cost["depth=2,k=1"] == problem.total_cost + 1
    assert cost["depth=2,k=2"] == problem.total_cost + 2


def test_no_members_without_module_paths():
    problem = solver.prepare(training_graph(chain([4] * 4, [1] * 4)))
    assert module_blocks(problem) == []


def test_the_exact_search_is_never_worse_than_per_block_checkpointing():
    graph, problem = _two_blocks()
    for member in module_blocks(problem):
        schedule = solver.solve(graph, member.schedule.peak, time_limit=10)
        assert schedule.cost <= member.schedule.cost
