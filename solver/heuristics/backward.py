"""Backward search: stage plans built from the last stage to the first.

The eviction heuristic (`solver.heuristics.eviction`) runs forward and decides what to keep before
it knows what later stages will need; on random_layered n=250 it gets stuck below 86% of the
checkpoint-all peak. This search runs backward, from what must be live, so it never keeps a value no
later compute reads.

State: (t, j, X). X is the set of values that must be live before the next compute (going
backward) of stage t; j bounds that compute's node (stages recompute in ascending order, so
going backward each recompute has a smaller index than the one undone before it). Moves:

- recompute i in stage t (i in X, i < j): the compute of i needs X | preds(i) live (i itself
  counted), which with i's transient bytes must fit the budget; before it, X - {i} | preds(i)
  must be live.
- close stage t: X is what stage t keeps from earlier stages (every member is < t); undo stage
  t - 1's own compute: X | {t-1} | preds(t-1) and t - 1's transient bytes must fit; before it
  X - {t-1} | preds(t-1).

Start: the last stage's compute (nothing is kept after it); goal: stage 0 closed with nothing
live. The peak of a compute is exactly what the move checks (eager frees: `solver.core.stages`), so
every plan found fits the budget. Search order: the state with the smallest stage first, ties
broken by the least bytes live or (by_cost) the least recompute cost so far: a depth-first
search over stages that tries "recompute nothing more" first and, where it gets stuck, backs
up to the latest stage with an untried recompute. It returns the first plan it reaches, None
when it runs out of states (`max_states`) or time. Leaving out values no later compute reads
never raises a peak, so without those limits the search is exhaustive over the stage space: it
finds a plan exactly when one fits (tests/test_solver_warm_start.py checks this against the
reference dynamic program); with them, None proves nothing.
"""

from __future__ import annotations

import heapq

from solver.core.graph import Problem
from solver.core.stages import Member, StagePlan, plan_to_ops
from solver.deadline import NEVER, Deadline

MAX_STATES = 200_000
"""States one search may create (each holds a set of up to n bits). The searches that reach a
plan create fewer: ties by bytes, random_layered n=250 at 80% of the checkpoint-all peak 25k,
n=500 at 90% 42k, n=1000 at 90% 175k, ResNet50 at 80% 30k; by cost, n=250 at 80% 149k."""

COST_STATES_FACTOR = 8
COST_STATES_EXTRA = 10_000
"""The search by cost may create this many times the states of the search by bytes, plus
the extra (random_layered n=250 at 80%: 25k by bytes, 149k by cost)."""


def _bits(x: int) -> list[int]:
    """Set bits of x, ascending."""
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out


def backward_runs(problem: Problem, budget: int, deadline: Deadline = NEVER) -> list[Member]:
    """The backward searches at `budget` bytes that reach a plan: ties to the least bytes live,
    then (within COST_STATES_FACTOR times the states that one created, at most MAX_STATES) to
    the least recompute cost so far, which is cheaper on the random graphs (random_layered n=250
    at 80%: 1.057 of computing every node once against 1.113) but can wander where many nodes
    cost nothing (FCN8, 25 of 73 nodes at cost 0: no plan in 200k states at 80% or 90%). Stops
    at `deadline`."""
    by_bytes, states = search(problem, budget, False, deadline)
    if by_bytes is None:
        return []
    cap = min(MAX_STATES, COST_STATES_FACTOR * states + COST_STATES_EXTRA)
    by_cost, _ = search(problem, budget, True, deadline, cap)
    return [by_bytes, *filter(None, [by_cost])]


def search(
    problem: Problem,
    budget: int,
    by_cost: bool = False,
    deadline: Deadline = NEVER,
    max_states: int = MAX_STATES,
) -> tuple[Member | None, int]:
    """One backward search at `budget` bytes; ties between states of the same stage go to the
    least bytes live (by_cost=False) or the least recompute cost so far (by_cost=True). Returns
    the plan (None where none was reached) and the number of states created."""
    n, mem, cost, transient = problem.n, problem.mem, problem.cost, problem.transient
    if n == 0:
        return None, 0
    reads = [sum(1 << p for p in problem.preds[v]) for v in range(n)]

    def added(live: int, x: int) -> int:
        """Bytes of the members of x not in live."""
        return sum(mem[i] for i in _bits(x & ~live))

    last = n - 1
    if mem[last] + added(1 << last, reads[last]) + transient[last] > budget:
        return None, 0
    start = (last, last, reads[last])
    start_bytes = added(0, reads[last])
    # state -> (parent state, node whose compute the move undid)
    parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start: None}
    heap = [(last, 0.0 if by_cost else start_bytes, start_bytes, 0.0, start)]
    goal = None
    while heap:
        if deadline.passed():
            break
        _, _, live_bytes, spent, state = heapq.heappop(heap)
        t, j, x = state
        if t == 0:
            if x == 0:
                goal = state
                break
            continue
        moves: list[tuple[tuple[int, int, int], int, int, float]] = []
        own = t - 1
        bit = 1 << own
        if live_bytes + added(x, bit | reads[own]) + transient[own] <= budget:
            after = (x & ~bit) | reads[own]
            moves.append(((own, own, after), own, added(0, after), spent))
        for i in _bits(x):
            if i >= j:
                break
            grown = added(x, reads[i])
            if live_bytes + grown + transient[i] <= budget:
                after = (x & ~(1 << i)) | reads[i]
                moves.append(((t, i, after), i, live_bytes - mem[i] + grown, spent + cost[i]))
        for child, node, child_bytes, child_spent in moves:
            if child in parent:
                continue
            if len(parent) >= max_states:
                return None, len(parent)
            parent[child] = (state, node)
            key = child_spent if by_cost else float(child_bytes)
            heapq.heappush(heap, (child[0], key, child_bytes, child_spent, child))
    if goal is None:
        return None, len(parent)
    return _member(problem, parent, goal, "by cost" if by_cost else "by bytes"), len(parent)


def _member(
    problem: Problem,
    parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None],
    goal: tuple[int, int, int],
    param: str,
) -> Member:
    """The plan along the parent links from `goal` (before the first compute) to the start.
    Each move's node is computed in the stage of the state it leads to; the first state of a
    stage met going forward holds what that stage keeps from earlier ones."""
    n = problem.n
    computed: list[list[int]] = [[] for _ in range(n)]
    kept: list[frozenset[int] | None] = [None] * (n + 1)
    kept[n] = frozenset()
    state = goal
    while True:
        t = state[0]
        if kept[t] is None:
            kept[t] = frozenset(_bits(state[2]))
        link = parent[state]
        if link is None:  # the start: the last stage's own compute
            computed[t].append(t)
            break
        state, node = link
        computed[t].append(node)
    plan = StagePlan(
        tuple(tuple(sorted(stage)) for stage in computed),
        tuple(k if k is not None else frozenset() for k in kept),
    )
    return Member(param, plan, plan_to_ops(problem, plan))
