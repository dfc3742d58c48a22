"""Repeated blocks (solver.core.repeats) and the lifetime search's moves made in every block at
once (solver.heuristics.lifetime_moves): mirrors are copies of one node in distinct blocks, a
move made in every block and a block's lifetimes copied onto another give valid plans whose fast
evaluation agrees with their replay (the search with such moves against the exhaustive optimum:
tests/test_solver_lifetimes.py)."""

from __future__ import annotations

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_strategies import repeated_training_graphs

import solver
from solver.core.repeats import mirrors
from solver.core.stages import LAST, Lifetimes, plan_from_lifetimes, plan_to_ops
from solver.heuristics.lifetime_moves import apply_move, copied_block, longer_moves, moves_out
from solver.heuristics.lifetimes import _evaluate


def test_mirrors_are_the_same_op_of_each_copy_of_a_layer():
    graph = nx.DiGraph()
    paths = ["stem", "h.0.attn", "h.0.attn", "h.0", "h.1.attn", "h.1.attn", "h.1", "head"]
    mems = [4, 2, 3, 1, 2, 3, 1, 4]
    for v, (path, mem) in enumerate(zip(paths, mems, strict=True)):
        graph.add_node(v, mem=mem, cost=1, module=path)
    graph.add_edges_from((v, v + 1) for v in range(7))
    problem = solver.prepare(graph)
    found = mirrors(problem)
    # the last node of h.1 feeds the head, as that of h.0 feeds h.1: same degrees, a group
    assert sorted(found.groups) == [(1, 4), (2, 5), (3, 6)]
    assert found.of(0) == () and found.of(7) == ()
    assert found.blocks == [("0",), ("1",)]
    assert found.block[4] == ("1",) and found.counterpart(4, ("0",)) == 1
    assert found.counterpart(1, ("1",)) == 4 and found.counterpart(1, ("7",)) is None
    # a different size is a different op: no group
    graph.nodes[5]["mem"] = 9
    assert sorted(mirrors(solver.prepare(graph)).groups) == [(1, 4), (3, 6)]


def test_no_numbered_module_means_no_mirrors():
    graph = nx.DiGraph([(0, 1), (1, 2)])
    for v in graph:
        graph.nodes[v].update(mem=1, cost=1, module="encoder.layer")
    assert not mirrors(solver.prepare(graph))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(repeated_training_graphs(), st.data())
def test_mirror_groups_hold_one_node_per_block(graph, data):
    problem = solver.prepare(graph)
    found = mirrors(problem)
    assert found, "the copies of the block are grouped"
    for group in found.groups:
        blocks = [found.block[v] for v in group]
        assert len(set(blocks)) == len(group) >= 2
        assert len({problem.mem[v] for v in group}) == 1
        assert len({problem.backward[v] for v in group}) == 1
        for v in group:
            assert all(found.counterpart(v, found.block[w]) == w for w in group)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(repeated_training_graphs(), st.data())
def test_moves_in_every_block_and_block_copies_give_valid_plans_evaluated_right(graph, data):
    problem = solver.prepare(graph)
    found = mirrors(problem)
    n = problem.n
    end = tuple(data.draw(st.integers(min_value=v, max_value=n - 1)) for v in range(n))
    retain = tuple(data.draw(st.integers(min_value=0, max_value=LAST)) for _ in range(n))
    lifetimes = Lifetimes(end, retain)
    current = _evaluate(problem, lifetimes)
    t = data.draw(st.integers(min_value=0, max_value=n - 1))
    v = data.draw(st.integers(min_value=0, max_value=n - 1))
    moves = moves_out(problem, lifetimes, current.live_around(t), t)
    moves += longer_moves(problem, lifetimes, v)
    trials = []
    for move in moves:
        moved = apply_move(problem, lifetimes, move, found)
        changed = {w for w in range(n) if moved.end[w] != end[w] or moved.retain[w] != retain[w]}
        assert changed <= {move[0], *found.of(move[0])}
        trials.append(moved)
    source, target = data.draw(st.permutations(found.blocks))[:2]
    copied = copied_block(problem, found, lifetimes, source, target)
    changed = {w for w in range(n) if copied.end[w] != end[w] or copied.retain[w] != retain[w]}
    assert all(found.block[w] == target for w in changed)
    for moved in [*trials, copied]:
        assert all(moved.end[w] >= w for w in range(n))
        schedule = plan_to_ops(problem, plan_from_lifetimes(problem, moved))
        replay = solver.simulate(graph, [(kind, problem.ids[i]) for kind, i in schedule.ops])
        replay.raise_if_invalid()
        fast = _evaluate(problem, moved)
        assert fast.stage_peaks == schedule.stage_peaks
        assert abs(fast.cost - schedule.cost) <= 1e-9 * max(1.0, schedule.cost)
