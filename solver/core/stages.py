"""Checkmate-style stage plans and their translation into op sequences.

A plan has one stage per node, in solver order. Stage t computes node t for the first time and,
before it, any earlier nodes it needs that are not live (recomputations), each at most once and in
topological order. `kept[t]` is the set of values live when stage t begins (carried over from
earlier stages). Within a stage, values are freed as early as possible: a value is dropped right
after its last use in the stage unless it is kept into the next stage; carried values with no use
and not kept are dropped when the stage begins. For a given plan this eager freeing gives the
lowest peak, so a plan determines its schedule.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass

from solver.core.graph import Problem


@dataclass(frozen=True)
class StagePlan:
    """computed[t]: ascending node indices computed in stage t (the last one is t).
    kept[t]: node indices live when stage t begins; kept[0] is empty, len(kept) == n + 1 and
    kept[n] (after the last stage) is empty.
    """

    computed: tuple[tuple[int, ...], ...]
    kept: tuple[frozenset[int], ...]

    def cost(self, problem: Problem) -> float:
        """Total cost of all computes (first computations and recomputations)."""
        return sum(problem.cost[i] for stage in self.computed for i in stage)


@dataclass(frozen=True)
class IndexedSchedule:
    """Ops over node indices with the peak (bytes, transients included) and cost they give,
    computed on the fly; stage_peaks: the peak of each stage of the plan they came from (bytes:
    the most, over the stage's computes, of the bytes live just after it plus its transient)."""

    ops: tuple[tuple[str, int], ...]
    peak: int
    cost: float
    stage_peaks: tuple[int, ...] = ()


@dataclass(frozen=True)
class EvictionKey:
    """What fixes an eviction run (`solver.heuristics.eviction`): the exponent of the distance
    to the next read in its rule, a positive factor per node (by index) multiplying the
    rule's score (None: every factor 1), and which reads count: with `recompute_reads`, a value
    is also read when an evicted value that a later stage needs is recomputed from it
    (`solver.heuristics.eviction.next_reads`); without, only when a later stage's own node
    reads it."""

    exponent: float
    priorities: tuple[float, ...] | None = None
    recompute_reads: bool = False


@dataclass(frozen=True)
class Member:
    """A candidate schedule: what produced it (`param`, e.g. a heuristic's parameter), its plan,
    the plan's ops and, where the plan came from `plan_from_lifetimes`, those lifetimes (a
    search over lifetimes resumes from them), or where it came from an eviction run by rule,
    that run's key (the eviction search resumes from it)."""

    param: str
    plan: StagePlan
    schedule: IndexedSchedule
    lifetimes: Lifetimes | None = None
    eviction: EvictionKey | None = None


def cheapest_within(members: Iterable[Member], budget: int | None) -> Member | None:
    """The lowest-cost member whose peak fits `budget` bytes (ties: lower peak), or None."""
    fitting = [m for m in members if budget is None or m.schedule.peak <= budget]
    return min(fitting, key=lambda m: (m.schedule.cost, m.schedule.peak), default=None)


def smallest_within(members: Iterable[Member], compute_budget: float | None) -> Member | None:
    """The lowest-peak member whose cost fits `compute_budget` (ties: lower cost), or None."""
    fitting = [
        m
        for m in members
        if compute_budget is None or m.schedule.cost <= compute_budget * (1 + 1e-12)
    ]
    return min(fitting, key=lambda m: (m.schedule.peak, m.schedule.cost), default=None)


def plan_to_ops(problem: Problem, plan: StagePlan) -> IndexedSchedule:
    """Expand a plan into compute/free ops with eager frees; O(total ops * in-degree)."""
    ops: list[tuple[str, int]] = []
    live_bytes = 0
    stage_peaks: list[int] = []
    cost = 0.0
    for t, stage in enumerate(plan.computed):
        carried = plan.kept[t]
        keep_next = plan.kept[t + 1]
        last_use: dict[int, int] = {}
        for k in stage:
            last_use[k] = k
            for p in problem.preds[k]:
                last_use[p] = k
        for i in sorted(carried.difference(last_use, keep_next)):
            ops.append(("free", i))
            live_bytes -= problem.mem[i]
        stage_peaks.append(0)
        for k in stage:
            ops.append(("compute", k))
            live_bytes += problem.mem[k]
            stage_peaks[t] = max(stage_peaks[t], live_bytes + problem.transient[k])
            cost += problem.cost[k]
            for i in (*problem.preds[k], k):
                if last_use.get(i) == k and i not in keep_next:
                    ops.append(("free", i))
                    live_bytes -= problem.mem[i]
                    last_use[i] = -1  # freed once even if i appears twice in the list
    return IndexedSchedule(tuple(ops), max(stage_peaks, default=0), cost, tuple(stage_peaks))


AT_USE, READ, LAST = 0, 1, 2
"""How long a recomputed copy of a value lives (`Lifetimes.retain`): until its stage ends, until
the value's last reader's first computation, or while any later stage reads it."""


@dataclass(frozen=True)
class Lifetimes:
    """How long each value's copies live, which determines a plan (`plan_from_lifetimes`).

    end[v]: the last stage in which v's first copy (computed in stage v) may be read; it is
    dropped after its last read up to then (n - 1: while any stage reads it, recomputes of its
    users included). retain[v]: AT_USE, READ or LAST for every copy recomputed later."""

    end: tuple[int, ...]
    retain: tuple[int, ...]


Window = list[int]
"""One copy of a value: [first stage it is live in, last stage it may be read in, last stage
it is read in (-1: none)]."""


def plan_from_ops(problem: Problem, ops: Sequence[tuple[str, Hashable]]) -> StagePlan:
    """The stage plan of a keep/recompute schedule's ops: stage t runs to the first compute of
    node t and the frees after it; what is live then is carried into t + 1."""
    computed: list[tuple[int, ...]] = []
    kept: list[frozenset[int]] = [frozenset()]
    live: set[int] = set()
    stage: list[int] = []
    seen: set[int] = set()
    boundary = False
    for kind, v in ops:
        i = problem.index[v]
        if boundary and kind == "compute":
            computed.append(tuple(sorted(stage)))
            kept.append(frozenset(live))
            stage, boundary = [], False
        if kind == "compute":
            stage.append(i)
            live.add(i)
            boundary = i not in seen
            seen.add(i)
        else:
            live.discard(i)
    computed.append(tuple(sorted(stage)))
    kept.append(frozenset())
    return StagePlan(tuple(computed), tuple(kept))


def lifetime_windows(
    problem: Problem, lifetimes: Lifetimes
) -> tuple[list[tuple[int, ...]], list[list[Window]], list[dict[int, Window] | None]]:
    """What `plan_from_lifetimes` computes: per stage, the nodes computed (ascending); per value,
    its copies (`Window`s, in order); per stage t that recomputes, the copy each value read or
    computed in t stands on (the one carried into t, or the one computed in t), None where t
    is computed alone. O(total computes * in-degree)."""
    n = problem.n
    preds, last_read = problem.preds, problem.last_user
    end, retain = lifetimes.end, lifetimes.retain
    windows: list[list[Window]] = [[] for _ in range(n)]
    # At most one copy of a value is live in any stage (a copy is made only where none is), and
    # copies are made in stage order: only a value's latest copy can be live in a later stage.
    latest: list[Window] = [[]] * n  # filled at stage v, before any stage reads v
    computed: list[tuple[int, ...]] = []
    serving: list[dict[int, Window] | None] = []
    for t in range(n):
        missing = []
        for p in preds[t]:
            window = latest[p]
            if window[1] >= t:
                window[2] = t
            else:
                missing.append(p)
        window = [t + 1, end[t], -1]
        windows[t].append(window)
        latest[t] = window
        if not missing:
            computed.append((t,))
            serving.append(None)
            continue
        # recomputations: the missing inputs' closure (every one earlier than t)
        used = {t: window, **{p: latest[p] for p in preds[t] if latest[p][2] == t}}
        stack, needed = list(missing), set(missing)
        while stack:
            for p in preds[stack.pop()]:
                window = latest[p]
                if window[1] >= t:
                    window[2] = t
                    used[p] = window
                elif p not in needed:
                    needed.add(p)
                    stack.append(p)
        stage = sorted(needed)
        for v in stage:
            window = [t + 1, (t, last_read[v], n - 1)[retain[v]], -1]
            used[v] = window
            windows[v].append(window)
            latest[v] = window
        computed.append((*stage, t))
        serving.append(used)
    return computed, windows, serving


def plan_from_lifetimes(problem: Problem, lifetimes: Lifetimes) -> StagePlan:
    """The plan in which each copy lives as `lifetimes` says: stage t computes t and, first,
    every input with no live copy, recursively; each copy is live from the stage after its
    computation through its last read within its lifetime. Every such plan is valid.
    O(n * (V + E)) in the worst case."""
    n = problem.n
    computed, windows, _ = lifetime_windows(problem, lifetimes)
    begins: list[list[int]] = [[] for _ in range(n + 1)]
    ends: list[list[int]] = [[] for _ in range(n + 1)]  # ends[t]: copies last live in t - 1
    for v, ws in enumerate(windows):
        for start, _, last in ws:
            if last >= start:
                begins[start].append(v)
                ends[last + 1].append(v)
    live: set[int] = set()
    kept = []
    for t in range(n + 1):
        live.difference_update(ends[t])
        live.update(begins[t])
        kept.append(frozenset(live))
    return StagePlan(tuple(computed), tuple(kept))


def plan_from_keep(
    problem: Problem, keep: Iterable[int], retain_recomputed: bool = True
) -> StagePlan:
    """The plan of a checkpoint policy: `keep` is the set of checkpointed nodes.

    A node in `keep` stays live from its first computation until the last stage that reads it.
    Any other node is dropped once its first pass is over: on a forward+backward graph after its
    last forward user (Chen et al.: the forward pass runs as usual, dropping what is not a
    checkpoint), on a graph without phases after its first user. When a later stage needs a
    dropped node it is recomputed (with whatever of its inputs is missing) and then kept until
    its last use, so a dropped segment is recomputed once. With retain_recomputed=False it is
    dropped again after the stage that recomputed it (recomputed at every use: least memory,
    most recomputation). keep = all nodes is checkpoint-all. These are lifetimes
    (`plan_from_lifetimes`). O(n * (V + E)) in the worst case.
    """
    n = problem.n
    keep_set = frozenset(keep)
    end = []
    for v in range(n):
        users = [w for w in problem.succs[v] if not problem.backward[w]]
        if v in keep_set:
            end.append(n - 1)
        elif problem.has_phases:
            end.append(max(users, default=v))
        else:
            end.append(min(problem.succs[v], default=v))
    retain = LAST if retain_recomputed else AT_USE
    return plan_from_lifetimes(problem, Lifetimes(tuple(end), (retain,) * n))


def stage_computes(
    problem: Problem, targets: Iterable[int], live: Collection[int]
) -> tuple[int, ...]:
    """What a stage computes to have `targets` (none of them live): the targets and,
    recursively, every input that is not in `live`, ascending."""
    needed = set(targets)
    stack = list(needed)
    while stack:
        for p in problem.preds[stack.pop()]:
            if p not in live and p not in needed:
                needed.add(p)
                stack.append(p)
    return tuple(sorted(needed))


def _complete(problem: Problem, wanted: Sequence[frozenset[int]]) -> StagePlan:
    """Stage t computes t and whatever (recursively) is missing for t and for wanted[t + 1]."""
    n = problem.n
    computed: list[tuple[int, ...]] = []
    kept: list[frozenset[int]] = [frozenset()]
    for t in range(n):
        live = kept[t]
        targets = [t, *(i for i in wanted[t + 1] if i not in live and i <= t)]
        computed.append(stage_computes(problem, targets, live))
        kept.append(frozenset(i for i in wanted[t + 1] if i <= t) if t + 1 < n else frozenset())
    return StagePlan(tuple(computed), tuple(kept))


def _drop_unread(problem: Problem, plan: StagePlan) -> list[frozenset[int]]:
    """The kept sets without values that no later stage reads before they are dropped."""
    kept = list(plan.kept)
    for t in range(problem.n - 1, 0, -1):
        read = {p for k in plan.computed[t] for p in problem.preds[k]}
        kept[t] = frozenset(i for i in kept[t] if i in kept[t + 1] or i in read)
    return kept


def plan_from_kept_sets(problem: Problem, wanted: Sequence[Iterable[int]]) -> StagePlan:
    """A valid plan keeping (at most) wanted[t] when stage t begins, t = 0..n; every value a
    stage needs that is not kept is recomputed in it."""
    first = _complete(problem, [frozenset(w) for w in wanted])
    return _complete(problem, _drop_unread(problem, first))


def complete_prefix(problem: Problem, plan: StagePlan, first_stage: int) -> StagePlan:
    """`plan` with its stages before `first_stage` replaced by a pass without recomputation:
    stage t < first_stage computes t alone and keeps each earlier value that a stage before
    first_stage reads or that plan.kept[first_stage] holds (the moment relaxation's solutions
    leave those stages empty, `solver.milp.formulation`)."""
    carried = plan.kept[first_stage]
    computed = [(t,) for t in range(first_stage)]
    kept = [
        frozenset(
            i
            for i in range(t)
            if i in carried or any(t <= j < first_stage for j in problem.succs[i])
        )
        for t in range(first_stage)
    ]
    return StagePlan((*computed, *plan.computed[first_stage:]), (*kept, *plan.kept[first_stage:]))


def checkpoint_all(problem: Problem) -> IndexedSchedule:
    """Every node once, in order, each freed after its last user: no recomputation."""
    return plan_to_ops(problem, plan_from_keep(problem, range(problem.n)))
