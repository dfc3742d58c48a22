"""The cascade cover (solver.milp.cascade) against the exhaustive stage-space optimum: its bound
(LP, certified from the duals, and CP-SAT's) never exceeds the optimum's recompute cost, at
every budget where the optimum changes; where a recompute needs a dead input it is above the
read-gap cover; its LP bound is certified (solver.milp.lp) whatever the duals; and the exact
search through the cascade step and the lifetime polish never claims more than the exhaustive
optimum allows."""

from __future__ import annotations

import time

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_reference import min_cost_within, stage_space_frontier
from solver_strategies import small_graphs, training_graphs

import solver
from solver import SolveOptions
from solver.core.stages import checkpoint_all
from solver.deadline import Deadline
from solver.exact.cascade import _from_evictions, _tight, cascade_cover, lifetime_polish
from solver.exact.state import Goal, Search
from solver.exact.warm_start import warm_start
from solver.examples import chain, training_graph
from solver.heuristics.eviction import evict_within
from solver.milp.cascade import Crossings, cascade_model
from solver.milp.cascade_rounds import cascade_bound
from solver.milp.cover import read_gap_cover
from solver.milp.lp import GrowingLp, safe_bound, solve_relaxation
from solver.milp.model import LinearModel
from solver.milp.units import CostUnits


def _dead_chain() -> nx.DiGraph:
    """A forward 0 -> 1 -> 2 -> 3 -> 4 whose values 1 and 2 only feed the next op (dead after
    it), and a backward 5 -> 6 where 6 reads 3 again and 0 (costly, 100). At 11 bytes stage 5
    (node 5, its input 4 and the crossing 3 and 0: 12 bytes) must let 3 go; the read-gap cover
    charges 3's recompute (1), but it needs 2 and 1 again, both dead: 3."""
    graph = nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (3, 6), (0, 6)])
    mems = [1, 4, 4, 4, 6, 1, 1]
    for v, mem in enumerate(mems):
        graph.nodes[v].update(mem=mem, cost=100 if v == 0 else 1)
    return graph


def _optima(graph: nx.DiGraph, problem) -> list[tuple[int, float]]:
    """Every budget below checkpoint-all's peak where the exhaustive optimum changes (and the
    one-line bound, and one byte below that peak) with the optimum there, where one exists."""
    frontier = stage_space_frontier(graph)
    top = checkpoint_all(problem).peak
    budgets = {peak for _, peak in frontier} | {top - 1, problem.memory_lower_bound}
    optima = [(b, min_cost_within(frontier, b)) for b in sorted(budgets)]
    return [(b, o) for b, o in optima if problem.memory_lower_bound <= b < top and o is not None]


def _bounds_hold(graph: nx.DiGraph) -> None:
    problem = solver.prepare(graph)
    units = CostUnits.of(problem)
    int_cost, unit = units.int_cost, units.unit
    for budget, optimum in _optima(graph, problem):
        for cpsat_workers in (None, 2):  # the 0/1 rounds by HiGHS's branch and cut, by CP-SAT
            cascade = cascade_bound(
                problem, budget, int_cost, deadline=Deadline.after(10), cpsat_workers=cpsat_workers
            )
            assert cascade.lp_bound <= cascade.bound
            assert problem.total_cost + cascade.bound * unit <= optimum + 1e-9


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.one_of(small_graphs(max_nodes=7), training_graphs(forward_nodes=3), st.just(_dead_chain()))
)
def test_the_cascade_bound_never_exceeds_the_exhaustive_optimum(graph):
    _bounds_hold(graph)


THROUGH_THE_CASCADE = {
    "after-warm-starts": SolveOptions(
        steps=(warm_start, cascade_cover, lifetime_polish), moment_late_share=2.0
    ),
    "alone": SolveOptions(steps=(cascade_cover, lifetime_polish), moment_late_share=2.0),
    "quiet-at-once": SolveOptions(
        steps=(warm_start, cascade_cover, lifetime_polish),
        moment_late_share=2.0,
        lifetime_quiet=0.0,
    ),
    "eviction-first": SolveOptions(
        steps=(warm_start, cascade_cover, lifetime_polish),
        moment_late_share=2.0,
        eviction_first=0.0,
    ),
}
"""The exact search with only the cascade step (its lifetime search not cut short by the moment
relaxation) and the lifetime polish, after the warm starts or from checkpoint-all alone: the
cascade bound and the lifetime plans decide the answer. "quiet-at-once": the lifetime search
counts as quiet once its starts are done, so the eviction search and the lifetime search from
its best (`_from_evictions`) take the rest of the step wherever it is not behind.
"eviction-first": every budget counts as tight (`_tight`), so the eviction search runs in the
lifetime search's place, in the cascade step and the polish."""


@pytest.mark.parametrize("options", THROUGH_THE_CASCADE.values(), ids=THROUGH_THE_CASCADE.keys())
def test_solving_through_the_cascade_step_agrees_with_the_exhaustive_optimum(options):
    """At every budget where the optimum changes: the replayed schedule fits, its bound is at
    most the optimum, and "OPTIMAL" only at the optimum's cost."""

    @settings(max_examples=30, deadline=None, derandomize=True)
    @given(
        st.one_of(
            small_graphs(max_nodes=7), training_graphs(forward_nodes=3), st.just(_dead_chain())
        )
    )
    def check(graph):
        problem = solver.prepare(graph)
        for budget, optimum in _optima(graph, problem):
            try:
                schedule = solver.solve(graph, budget, time_limit=0.5, options=options)
            except solver.SolverTimeoutError:  # no warm start fits and the search found none
                continue
            assert solver.simulate(graph, schedule.ops).peak <= budget
            assert schedule.bound <= optimum + 1e-9 <= schedule.cost + 2e-9
            if schedule.status == "OPTIMAL":
                assert abs(schedule.cost - optimum) <= 1e-9

    check()


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.one_of(training_graphs(forward_nodes=3), st.just(_dead_chain())))
def test_the_lifetime_search_from_evictions_offers_plans_that_fit(graph):
    """`_from_evictions` (the eviction search, then the lifetime search from its best): every
    plan it offers replays within the budget and never beats the exhaustive optimum; where an
    eviction run fits, it offers at least one (the lifetime search's first plan)."""
    problem = solver.prepare(graph)
    for budget, optimum in _optima(graph, problem):
        goal = Goal("cost", CostUnits.of(problem), budget)
        now = time.perf_counter()
        search = Search(graph, problem, goal, SolveOptions(), 1, Deadline.after(5), 5.0, now)
        offered = []
        _from_evictions(search, Deadline.after(0.2), offered.append, offered.append, lambda: False)
        for member in offered:
            ops = [(kind, problem.ids[i]) for kind, i in member.schedule.ops]
            replay = solver.simulate(graph, ops)
            replay.raise_if_invalid()
            assert replay.peak <= budget
            assert member.schedule.cost >= optimum - 1e-9
        if evict_within(problem, budget) is not None:
            assert offered


def test_a_dead_input_chain_is_counted_where_the_read_gap_cover_misses_it():
    graph = _dead_chain()
    problem = solver.prepare(graph)
    int_cost = CostUnits.of(problem).int_cost
    cover = read_gap_cover(problem, 11, int_cost, deadline=Deadline.after(10), workers=2)
    optimum = min_cost_within(stage_space_frontier(graph), 11)
    for cpsat_workers in (None, 2):
        cascade = cascade_bound(
            problem, 11, int_cost, deadline=Deadline.after(10), cpsat_workers=cpsat_workers
        )
        assert (cover.bound, cascade.bound, optimum) == (1, 3, problem.total_cost + 3)


def test_the_certified_bound_holds_for_any_multipliers():
    """min x0 + 2 x1 + 3 x2 s.t. x0 + x1 >= 1, x1 + x2 >= 1 (0/1): optimum 2 (x1). The duals
    (1, 1) certify 1 + 1 = 2 (reduced costs 0, 0, 2, none negative); wrong-signed or huge
    multipliers still give a valid (weaker) bound."""
    lm = LinearModel()
    x = [lm.var(f"x{i}", 0, 1) for i in range(3)]
    lm.objective = {x[0]: 1, x[1]: 2, x[2]: 3}
    lm.row([(1, x[0]), (1, x[1])], 1, None)
    lm.row([(1, x[1]), (1, x[2])], 1, None)
    assert safe_bound(lm, np.array([1.0, 1.0])).bound == 2
    for y in ([-5.0, 1.0], [10.0, 10.0], [0.0, 0.0], [0.5, 1.5]):
        assert safe_bound(lm, np.array(y)).bound <= 2
    lp = solve_relaxation(lm, Deadline.after(10))
    assert lp is not None and lp.bound == 2
    # reduced costs (0, 0, 2): x2 = 1 costs at least 2 + 2 = 4, so it is 0 below a cap of 4
    assert lp.fixings(3) == {x[2]: 0} and lp.fixings(4) == {}


def test_the_model_is_the_read_gap_cover_without_dead_inputs():
    """A chain 0 -> 1 -> 2 -> 3 with a skip 0 -> 3 at 8 bytes: value 0 has one gap, one row
    (without the timing rows, which give each crossing value a variable per row)."""
    graph = nx.DiGraph([(0, 1), (1, 2), (2, 3), (0, 3)])
    for v, mem in enumerate([4, 2, 3, 1]):
        graph.nodes[v].update(mem=mem, cost=5)
    problem = solver.prepare(graph)
    model = cascade_model(problem, Crossings.of(problem, 8), [5, 5, 5, 5], timing=False)
    assert model.lm.names == ["x[0,2..2]"] and model.rows == (2,)
    assert model.lm.rows == [([0], [4], 1, None)]


@st.composite
def _op_level_graphs(draw) -> nx.DiGraph:
    """A forward chain f0 -> ... -> f(n-1) and a backward chain b(n-1) -> ... -> b0 where b_j
    reads f_j only for some j: the other forward values are dead after their forward reader,
    as a GELU's intermediates are at op level, so recomputes cascade through them."""
    n = draw(st.integers(4, 9))
    graph = nx.DiGraph()
    graph.add_edges_from((f"f{j}", f"f{j + 1}") for j in range(n - 1))
    graph.add_edge(f"f{n - 1}", f"b{n - 1}")
    graph.add_edges_from((f"b{j + 1}", f"b{j}") for j in range(n - 1))
    for j in range(n - 1):
        if draw(st.booleans()):
            graph.add_edge(f"f{j}", f"b{j}")
    for v in graph.nodes:
        graph.nodes[v].update(mem=draw(st.integers(1, 6)), cost=draw(st.integers(0, 5)))
    return graph


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.one_of(training_graphs(forward_nodes=6), _op_level_graphs()),
    st.floats(0.0, 1.0),
    st.integers(1, 3),
)
def test_a_model_grown_row_by_row_is_the_model_built_at_once(graph, where, per_round):
    """Rows added a few at a time (`CascadeModel.add_rows`, as row generation adds them) give
    the variables, costs and rows of the model built with all of them at once, plus only rows
    L[p,t'] <= L[p,t] that the consecutive ones imply; the LP re-solved from its last basis
    after each addition (`GrowingLp`) ends at the certified bound of the model built at once."""
    problem = solver.prepare(graph)
    low, top = problem.memory_lower_bound, checkpoint_all(problem).peak
    if top - 1 < low:  # checkpoint-all has the least peak: no budget below it fits
        return
    crossings = Crossings.of(problem, int(low + where * (top - 1 - low)))
    int_cost = CostUnits.of(problem).int_cost
    whole = cascade_model(problem, crossings, int_cost)
    grown = cascade_model(problem, crossings, int_cost, crossings.tight[-1:])
    relaxation = GrowingLp(grown.lm)
    rows = list(reversed(crossings.tight[:-1]))
    while True:
        assert relaxation.solve(Deadline.after(10)) is not None
        if not rows:
            break
        grown.add_rows(rows[:per_round])
        rows = rows[per_round:]

    def named(model):
        names = model.lm.names
        rows = {
            (tuple(sorted((names[v], c) for v, c in zip(vs, cs, strict=True))), lo, hi)
            for vs, cs, lo, hi in model.lm.rows
        }
        return rows, {names[v]: c for v, c in model.lm.objective.items()}

    (whole_rows, whole_cost), (grown_rows, grown_cost) = named(whole), named(grown)
    assert sorted(whole.lm.names) == sorted(grown.lm.names) and whole_cost == grown_cost
    assert whole.rows == grown.rows and whole_rows <= grown_rows
    for terms, lo, hi in grown_rows - whole_rows:
        assert lo is None and hi == 0 and len(terms) == 2
        assert {c for _, c in terms} == {1, -1} and all(n.startswith("L[") for n, _ in terms)
    solved = relaxation.solve(Deadline.after(10))
    at_once = solve_relaxation(whole.lm, Deadline.after(10))
    assert solved is not None and at_once is not None
    assert abs(solved.base - at_once.base) <= 1e-6 * max(1.0, abs(at_once.base))


def test_a_budget_is_tight_where_the_incumbent_eviction_run_recomputes_enough():
    """A six-step chain (every node once: 105 units): at 34 bytes eviction's best run
    recomputes 26 units (0.25 of 105), at 49 bytes 6 (0.06). With `eviction_first` 0.2 only
    the first is tight; without an incumbent nothing is."""
    graph = training_graph(chain([4, 9, 9, 4, 7, 9], [6, 6, 8, 5, 9, 1]))
    problem = solver.prepare(graph)
    options = SolveOptions(eviction_first=0.2)
    tight = {}
    for budget in (34, 49):
        goal = Goal("cost", CostUnits.of(problem), budget)
        now = time.perf_counter()
        search = Search(graph, problem, goal, options, 1, Deadline.after(5), 5.0, now)
        assert not _tight(search)
        run = evict_within(problem, budget)
        assert run is not None
        search.offer(run)
        tight[budget] = _tight(search)
    assert tight == {34: True, 49: False}
