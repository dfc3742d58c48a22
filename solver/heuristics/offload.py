"""Offload heuristics: whole-activation offload, written as plans of the stage space with offload
(docs/offload.md, "The stage space with offload"), so that the exact model can start from them.

From a keep/recompute stage plan (checkpoint-all, or a solved schedule's), a value whose first
copy is carried through stages that do not read it is offloaded right after its computation,
dropped after the last read before its longest such gap (or held on while its copy runs) and
reloaded at the start of a stage before the next read; everything else is the base plan's.

    offload_runs(graph, problem, budget, link, bases, deadline)
      per base plan, per timing ("tight": drop at once, reload at the read's stage; "hidden":
      hold the first copy until its offload is estimated done, reload early enough to cover
      the copy by the compute between):
        "all"          every value with a gap offloaded (torchtune's offload of every saved
                       activation, within the space's restrictions)
        "until fits"   the values crossing the base's peak stage, largest first, then the
                       others, largest first: the fewest that fit the budget (bisection)

Each run is replayed by the independent simulator over the link (`solver.core.simulate`), which
gives its peak, cost (compute plus stall) and validity (host bytes within the link's limit).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx

from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import OffloadPlan, offload_ops
from solver.core.simulate import simulate
from solver.core.stages import StagePlan, plan_to_ops
from solver.deadline import NEVER, Deadline

TIMINGS = ("tight", "hidden")
"""When a copy's value leaves and returns (module docstring)."""


@dataclass(frozen=True)
class OffloadRun:
    """A heuristic plan with offload (`param` says which), its ops over node indices and what
    the simulator found: `valid`, `peak` (bytes), `cost` (graph units, stall included)."""

    param: str
    plan: OffloadPlan
    ops: tuple[tuple[str, int], ...]
    valid: bool
    peak: int
    cost: float

    def fits(self, budget: int) -> bool:
        """Valid and within `budget` bytes."""
        return self.valid and self.peak <= budget


@dataclass(frozen=True)
class _Gap:
    """Value `value`'s first copy is read in stage `before` (its computation's stage, or a
    read) and next in stage `after` >= before + 2, carried unread through the stages between."""

    value: int
    before: int
    after: int


def offload_runs(
    graph: nx.DiGraph,
    problem: Problem,
    budget: int,
    link: Link,
    bases: dict[str, StagePlan],
    deadline: Deadline = NEVER,
) -> list[OffloadRun]:
    """The runs of the module docstring for each named base plan, each replayed over `link`;
    those made before `deadline` passes. O(bases * log n) simulations of O(ops * in-degree)."""
    runs: list[OffloadRun] = []
    for name, base in bases.items():
        gaps = _longest_gaps(problem, base)
        if not gaps:
            continue
        peaks = plan_to_ops(problem, base).stage_peaks
        turn = max(range(problem.n), key=peaks.__getitem__)
        order = sorted(
            gaps, key=lambda g: (not g.before < turn < g.after, -problem.mem[g.value], g.value)
        )
        for timing in TIMINGS:
            if deadline.passed():
                return runs
            run = _Runs(graph, problem, link, base, order, f"{name}, {timing}", timing)
            every = run(len(order), "offload all")
            runs.append(every)
            if every.fits(budget):
                fewest = _fewest(run, len(order), budget, deadline)
                if fewest is not None:
                    runs.append(fewest)
    return runs


@dataclass(frozen=True)
class _Runs:
    """The runs of one base plan and timing: `base` with a prefix of the gaps in `order`
    offloaded over `link` (`label`: the base's name and the timing)."""

    graph: nx.DiGraph
    problem: Problem
    link: Link
    base: StagePlan
    order: list[_Gap]
    label: str
    timing: str

    def __call__(self, count: int, param: str) -> OffloadRun:
        """`base` with the first `count` gaps of `order` offloaded, replayed."""
        plan = _plan(self.problem, self.base, self.order[:count], self.link, self.timing)
        return _replayed(self.graph, self.problem, self.link, plan, f"{param} ({self.label})")


def _fewest(run, count: int, budget: int, deadline: Deadline) -> OffloadRun | None:
    """The run of the fewest first values that fits `budget`, by bisection over how many
    (`run(k, param)`: the first k offloaded; `count` of them fit), or None where the deadline
    passed first or only all of them fit. A run fitting at k need not fit at every larger k: a
    heuristic search."""
    low, high, best = 0, count, None  # k = low does not fit (or is 0); k = high fits
    while high - low > 1:
        if deadline.passed():
            return best
        middle = (low + high) // 2
        candidate = run(middle, "offload until fits")
        if candidate.fits(budget):
            high, best = middle, candidate
        else:
            low = middle
    return best


def _longest_gaps(problem: Problem, base: StagePlan) -> list[_Gap]:
    """Per value, the longest gap (in stages) of its first copy in `base`: from its computation
    through the stages that carry it on, between consecutive reads at least two stages apart."""
    reads: list[set[int]] = [set() for _ in range(problem.n)]
    for t, stage in enumerate(base.computed):
        for k in stage:
            for i in problem.preds[k]:
                reads[i].add(t)
    gaps = []
    for i in range(problem.n):
        points, t = [i], i + 1
        while t < problem.n and i in base.kept[t]:
            if t in reads[i]:
                points.append(t)
            t += 1
        pairs = [(a, b) for a, b in itertools.pairwise(points) if b - a >= 2]
        if pairs:
            before, after = max(pairs, key=lambda p: (p[1] - p[0], -p[0]))
            gaps.append(_Gap(i, before, after))
    return gaps


def _plan(
    problem: Problem, base: StagePlan, gaps: list[_Gap], link: Link, timing: str
) -> OffloadPlan:
    """`base` with each gap's value offloaded: its first copy carried into stages up to `drop`,
    reloaded at the start of stage `back` and carried on from there as before (a gap whose
    value would be back before it left is skipped). "tight": drop = the read before the gap,
    back = the read after it. "hidden", on the base's clock (each stage's computes in a row,
    no waits): the first copy is held until the d2h engine (copies in order of computation) is
    estimated done with it, and the reload starts at the latest stage whose compute up to the
    read covers its copy time (else the first stage after the drop)."""
    start = [0.0]
    for stage in base.computed:
        start.append(start[-1] + sum(problem.cost[k] for k in stage))
    kept = [set(stage) for stage in base.kept]
    reloaded: list[set[int]] = [set() for _ in range(problem.n)]
    offloaded = set()
    engine = 0.0  # when the d2h engine is estimated done with the copies so far
    for gap in sorted(gaps, key=lambda g: g.value):
        i, drop, back, done = gap.value, gap.before, gap.after, engine
        if timing == "hidden":
            done = max(engine, start[i + 1]) + link.offload_time(problem.mem[i])
            while drop < gap.after and start[drop + 1] < done:
                drop += 1
            need = link.reload_time(problem.mem[i])
            back = max(
                (s for s in range(drop + 2, gap.after + 1) if start[gap.after] - start[s] >= need),
                default=drop + 2,
            )
        if back > gap.after:
            continue  # no stage without the value on the device
        engine = done
        offloaded.add(i)
        for t in range(drop + 1, back + 1):
            kept[t].discard(i)
        reloaded[back].add(i)
    stages = StagePlan(base.computed, tuple(frozenset(k) for k in kept))
    return OffloadPlan(stages, tuple(frozenset(r) for r in reloaded), frozenset(offloaded))


def _replayed(
    graph: nx.DiGraph, problem: Problem, link: Link, plan: OffloadPlan, param: str
) -> OffloadRun:
    """The run of `plan`: its ops, replayed by the simulator over `link`."""
    ops = tuple(offload_ops(problem, plan))
    checked = simulate(graph, [(kind, problem.ids[i]) for kind, i in ops], link)
    return OffloadRun(param, plan, ops, checked.valid, checked.peak, checked.cost)
