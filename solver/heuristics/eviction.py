"""Eviction under a budget: a memory-aware heuristic for any DAG (DTR-like, with the future known).

The graph runs stage by stage in solver order: stage t computes node t and, first, whatever of its
inputs is not live, recursively. Every value stays live (as a cache that cuts later recomputations
short) until computing a node would exceed the budget; then live values are evicted until it fits
(its output and transient bytes included): values no later stage reads first (largest first), then
the one with the most bytes times (a power of) the distance to its next read per unit of rebuild
cost (its own cost plus that of its evicted ancestors it would need, counted along every path). A
value read later in the current stage is never evicted, so the run is a `StagePlan`;
`solver.core.stages.plan_from_kept_sets` then drops kept values no stage reads, which only lowers
the peak. When everything live is needed for the next compute, that run fails.

Which reads count (`EvictionKey.recompute_reads`, `next_reads`): a later stage's own node reading
the value, or also the recomputation of an evicted value that a later stage needs. With the
first, a value whose direct readers are all done goes first even where it is what a later
rebuild would start from: on GPT-2 (tied embeddings) the language-model head's weight gradient
(1 MiB) is read only by the last node, the final hidden state that rebuilds it is dropped once
its own readers are done, and at tight budgets the last stage recomputes the whole forward
(0.38-0.42 of the step's cost on `benchmarks.zoo` GPT-2-4 at 11% of the checkpoint-all peak).
`eviction_runs` makes both kinds of run; neither is cheaper on every graph.

The checkpoint policies of `solver.heuristics.baselines` choose what to keep without looking at
the budget; this heuristic spends the budget, so it fits where they cannot (random_layered n=250
at 90% of the checkpoint-all peak: tests/test_solver_eviction.py).

A run by rule is fixed by its `EvictionKey` (the rule's exponent and, optionally, a factor per
node on its score); `solver.heuristics.eviction_search` searches over those factors.

Every run stops at its `deadline` (`solver.deadline`) and then counts as stuck.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence

from solver.core.graph import Problem
from solver.core.stages import (
    EvictionKey,
    Member,
    cheapest_within,
    plan_from_kept_sets,
    plan_to_ops,
    stage_computes,
)
from solver.deadline import NEVER, Deadline


def rebuild_costs(problem: Problem, live: set[int], upto: int | None = None) -> list[float]:
    """For every node (up to index `upto`, inclusive; None: all), what recomputing it would
    cost if it were evicted now: its own cost plus, for each input that is not live, that
    input's rebuild cost (shared ancestors count once per path: an over-estimate that ranks deep
    recomputations last); entries past `upto` are 0. O(V + E)."""
    cost, preds = problem.cost, problem.preds
    rebuild = [0.0] * problem.n
    for v in range(problem.n if upto is None else upto + 1):  # solver order is topological
        missing = 0.0
        for p in preds[v]:
            if p not in live:
                missing += rebuild[p]
        rebuild[v] = cost[v] + missing
    return rebuild


def next_reads(
    problem: Problem, live: set[int], t: int, recompute_reads: bool, nodes: Iterable[int]
) -> dict[int, float]:
    """For each of `nodes` (each at most t), the first stage after t that reads it (math.inf:
    none).

    A stage j reads its own node's inputs. With `recompute_reads`, it also reads the inputs of
    every value it recomputes: a value up to t that is not live and that stage j reads (directly
    or so, recursively) is recomputed there from its inputs, which are then read at j too.
    O(V + E) at most (each node's successors are visited once)."""
    succs, last_descendant = problem.succs, problem.last_descendant

    def split(w: int) -> tuple[float, Sequence[int]]:
        """w's first user after t (math.inf: none) and its users up to t."""
        users = succs[w]
        at = bisect_right(users, t)
        return (users[at] if at < len(users) else math.inf), users[:at]

    if not recompute_reads:
        return {w: split(w)[0] for w in nodes}
    read: dict[int, float] = {}
    for root in nodes:
        stack = [root]
        while stack:  # depth first: w is finished after the users it is read through
            w = stack[-1]
            if w in read:
                stack.pop()
                continue
            first, earlier = split(w)
            pending = False
            for j in earlier:
                if j in live or last_descendant[j] <= t:  # live, or nothing after t reads j
                    continue
                through = read.get(j)
                if through is None:
                    stack.append(j)
                    pending = True
                elif through < first:
                    first = through
            if not pending:
                read[w] = first
                stack.pop()
    return read


DISTANCE_EXPONENTS = (2.0, 1.0, 0.5, 0.0)
"""The runs `evict_within` makes, one per weight of the distance to the next read: bytes times
distance**e per unit of rebuild cost. No single exponent is best everywhere (FCN8 at 80% reaches
its optimum only with e = 2, random_layered n=500 at 90% is 1.5x cheaper with e <= 1;
`python -m benchmarks.solving.solver_scale` lists eviction's cost beside the optimum)."""


Chooser = Callable[[int, list[int], set[int], dict[int, float]], int]
"""Picks the value to evict at stage t among candidates (live, not read later in the stage, each
read by a later stage), given the live set and each node's next read (`next_reads`)."""


def _by_distance(
    problem: Problem, exponent: float, priority: Sequence[float] | None = None
) -> Chooser:
    """The most bytes times distance**exponent to the next read per unit of rebuild cost, times
    `priority[v]` where given (a positive factor per node; `solver.heuristics.eviction_search`
    searches over them)."""

    def choose(t: int, candidates: list[int], live: set[int], read: dict[int, float]) -> int:
        rebuild = rebuild_costs(problem, live, upto=max(candidates))

        def score(v: int) -> tuple[float, int, int]:
            weight = problem.mem[v] * (read[v] - t) ** exponent
            if priority is not None:
                weight *= priority[v]
            return (math.inf if rebuild[v] <= 0 else weight / rebuild[v], problem.mem[v], -v)

        return max(candidates, key=score)

    return choose


def evict_by_key(
    problem: Problem,
    budget: int,
    key: EvictionKey,
    deadline: Deadline = NEVER,
    cost_cap: float | None = None,
) -> Member | None:
    """The eviction run at `budget` bytes by the rule and factors of `key` (`_by_distance`), or
    None where it gets stuck, `deadline` passes or it costs more than `cost_cap` (graph units,
    where given); the member carries `key`."""
    choose = _by_distance(problem, key.exponent, key.priorities)
    reads = ",recompute reads" if key.recompute_reads else ""
    searched = "" if key.priorities is None else ",searched"
    param = f"budget={budget},e={key.exponent:g}{reads}{searched}"
    return _run(problem, budget, choose, param, deadline, key, cost_cap)


def _run(
    problem: Problem,
    budget: int,
    choose: Chooser,
    param: str,
    deadline: Deadline = NEVER,
    key: EvictionKey | None = None,
    cost_cap: float | None = None,
) -> Member | None:
    """One eviction run at `budget` bytes evicting by `choose`, or None where it gets stuck,
    `deadline` passes or (where given) the cost of its computes so far exceeds `cost_cap`
    (graph units; the run's cost only grows); `key`, where given, is what fixed `choose` (kept
    on the member) and which reads count (direct ones only where no key is given)."""
    mem = problem.mem
    recompute_reads = key is not None and key.recompute_reads
    live: set[int] = set()
    live_bytes = 0
    cost = 0.0
    kept: list[frozenset[int]] = [frozenset()]
    for t in range(problem.n):
        if deadline.passed():
            return None
        stage = stage_computes(problem, [t], live)
        cost += sum(problem.cost[k] for k in stage)
        if cost_cap is not None and cost > cost_cap * (1 + 1e-12):
            return None
        reads: dict[int, int] = {}
        for k in stage:
            for p in problem.preds[k]:
                reads[p] = reads.get(p, 0) + 1
        for k in stage:
            # Values no later stage reads, popped largest first: evicting one changes no other
            # value's next read (nothing later is recomputed through it), so one call serves all.
            unread: list[int] = []
            while live_bytes + mem[k] + problem.transient[k] > budget:
                if unread:
                    victim = unread.pop()
                else:
                    candidates = [v for v in live if not reads.get(v)]
                    if not candidates:
                        return None
                    read = next_reads(problem, live, t, recompute_reads, candidates)
                    unread = sorted(
                        (v for v in candidates if read[v] == math.inf), key=lambda v: (mem[v], -v)
                    )
                    victim = unread.pop() if unread else choose(t, candidates, live, read)
                live.remove(victim)
                live_bytes -= mem[victim]
            live.add(k)
            live_bytes += mem[k]
            for p in problem.preds[k]:
                reads[p] -= 1
        kept.append(frozenset(live))
    kept[-1] = frozenset()
    plan = plan_from_kept_sets(problem, kept)
    return Member(param, plan, plan_to_ops(problem, plan), eviction=key)


def eviction_runs(
    problem: Problem,
    budget: int,
    deadline: Deadline = NEVER,
    recompute_reads: Sequence[bool] = (False, True),
) -> list[Member]:
    """The eviction runs at `budget` bytes that do not get stuck (or cut off by `deadline`), one
    per DISTANCE_EXPONENTS and kind of reads in `recompute_reads` (`EvictionKey`; each peak is
    at most the budget): the heuristic as a family, for the tables that list it beside the
    baselines. O(n * (V + E) * evictions per stage) per run; a run counting recomputations'
    reads takes 2-3x as long as one counting direct reads."""
    keys = [EvictionKey(e, None, kind) for kind in recompute_reads for e in DISTANCE_EXPONENTS]
    runs = [evict_by_key(problem, budget, key, deadline) for key in keys]
    return [run for run in runs if run is not None]


def evict_within(problem: Problem, budget: int, deadline: Deadline = NEVER) -> Member | None:
    """The cheapest of `eviction_runs` at `budget` bytes, or None when all get stuck."""
    return cheapest_within(eviction_runs(problem, budget, deadline), budget)


def evict_by_keep(
    problem: Problem,
    budget: int,
    keep_fraction: Sequence[dict[int, float]],
    deadline: Deadline = NEVER,
) -> Member | None:
    """An eviction run at `budget` bytes that evicts the value kept least into the next stage by
    a fractional keep (keep_fraction[t][i]: S[t,i] in [0, 1] of the LP relaxation, as for
    `solver.heuristics.rounding`), or None where it gets stuck or `deadline` passes. Where
    thresholds round the LP into plans over or under the budget, this spends the budget in the
    LP's order (on MobileNet at 90% it gives the optimum from the first LP)."""

    def choose(t: int, candidates: list[int], live: set[int], read: dict[int, float]) -> int:
        following = keep_fraction[t + 1]
        return min(candidates, key=lambda v: (following.get(v, 0.0), -problem.mem[v], v))

    return _run(problem, budget, choose, f"budget={budget},lp", deadline)
