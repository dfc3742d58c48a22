"""The largest size (batch, sequence length) whose training step fits a memory, with its proof.

    largest_fitting(graph_at, memory, compute_budget=..., time_limit=...)
      probe(graph_at(s), memory, cap)      one size: "fits", "does not fit" or "open"
        solve(objective="memory")          least peak within the cap: a schedule at or under
                                           the memory fits; a proven bound above it does not
        solve(budget=memory)               where that leaves it open: least cost within the
                                           memory, against the cap
      doubling from `low`, then bisection  between the largest size that fits and the least
                                           that does not (in the widest gap left by open
                                           sizes), until they are adjacent or the time is
                                           spent (the sizes between are then open)

NOTE [fit proofs]: "fits" rests only on a schedule that the simulator replays at or under
`memory` bytes and within the compute cap. "Does not fit" rests only on a proven bound over the
solver's schedule space (Checkmate's stage schedules, `docs/solver.md`): the least peak within
the cap proven above `memory`, the least cost within `memory` proven above the cap, or no
schedule within `memory` at all (`InfeasibleBudgetError`). An incumbent never proves that a size
does not fit. With a host link (`offload`), the space is the stage space with offload
(docs/offload.md), which holds every keep/recompute schedule: a keep/recompute schedule that
fits still fits, but its bounds prove nothing there (a copy may take a value's place); "does not
fit" then rests on the one-line floor (`Problem.one_line_floor`: the pending-inputs floor assumes
inputs stay live, which a reload need not) or on the offload solve's proven cost bound (less
what rounding the times to whole units may have moved it, `OffloadTimes.rounding`) or
infeasibility.

NOTE [monotone sizes]: that a size is the largest rests on the least peak within the cap never
falling as the size grows. It holds when the graphs at every size have the same nodes, edges and
costs and each node's bytes (`mem`, `transient`) never fall as the size grows: every schedule's
peak then never falls and the schedules within the cap are the same. `largest_fitting` checks
exactly that between the graphs it probes and raises GraphError where it fails. With offload
it holds too: a copy's time is the link's fixed latency plus its value's bytes over the
link's bandwidth, so no copy gets faster and no timeline ends sooner as the size grows, and the
host limit does not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

import networkx as nx

from solver.core.budget import checkpoint_all_peak, parse_compute_budget
from solver.core.graph import prepare
from solver.core.link import Link
from solver.core.schedule import Schedule
from solver.core.simulate import simulate
from solver.deadline import Deadline
from solver.errors import (
    ArgumentError,
    GraphError,
    InfeasibleBudgetError,
    InternalError,
    SolverTimeoutError,
)
from solver.exact import solve
from solver.fitting.sizes import DOES_NOT_FIT, FITS, OPEN, largest_between
from solver.heuristics.baselines import block_checkpoint
from solver.milp.offload.times import OffloadTimes
from solver.time_shares import FIT_SHARES, FitShares


@dataclass
class Probe:
    """What was proven at one size. `verdict` is FITS, DOES_NOT_FIT or OPEN; `schedule` is the
    schedule that fits (FITS only); `peak` is the least peak found within the cap and `bound` a
    proven lower bound on it (bytes; `bound` is None where only the cost solve decided);
    `reason` says what decided; `seconds` the wall time of the probe."""

    size: int
    verdict: str
    reason: str
    seconds: float
    peak: int | None = None
    bound: int | None = None
    schedule: Schedule | None = field(default=None, repr=False)


@dataclass
class FitResult:
    """The outcome of `largest_fitting`.

    `size`: the largest size proven to fit (None: not even `low` was shown to fit);
    `upper`: the least size proven not to fit (None: none was); `proven`: `upper == size + 1`
    (NOTE [monotone sizes]); `schedule`: the schedule at `size`; `probes`: every size tried, in
    order; `seconds`: wall time. The sizes strictly between `size` and `upper` are open."""

    size: int | None
    upper: int | None
    proven: bool
    schedule: Schedule | None
    probes: list[Probe]
    seconds: float

    @property
    def interval(self) -> tuple[int | None, int | None]:
        """(largest size that fits, least size that does not): the maximum lies in [a, b)."""
        return self.size, self.upper


def probe(
    graph: nx.DiGraph,
    memory: int,
    compute_budget: float | str | None,
    deadline: Deadline,
    *,
    size: int = 0,
    workers: int = 8,
    offload: Link | None = None,
    shares: FitShares = FIT_SHARES,
) -> Probe:
    """Decide whether a schedule of `graph` peaks at or under `memory` bytes within the compute
    budget (a factor of computing every node once, 1.3 or "1.3x", or "0.02units": the
    spellings of `solver.core.budget`; None: unlimited), by `deadline` (NOTE [fit
    proofs]). The peak floor above `memory`, or checkpoint-all within it, decides at once;
    else `shares.probe_least_peak` of the time goes to the least peak within the cap (it
    closes at once on chains and small graphs) and, where that leaves it open, the rest to the
    least cost within `memory` against the cap. With a host link (`offload`), the floor is the
    one-line floor and the time goes to the least cost with offload within `memory` (its cost
    the compute plus the stall; its schedule may hold bytes on the host): `largest_fitting` has
    decided the keep/recompute schedules before (NOTE [fit proofs])."""
    started = time.perf_counter()
    problem = prepare(graph)
    cap = None if compute_budget is None else parse_compute_budget(compute_budget, problem)
    peak: int | None = None
    bound: int | None = problem.memory_lower_bound if offload is None else problem.one_line_floor
    # a cost bound with offload is over times rounded to whole units: less what rounding moves
    slack = 0.0 if offload is None else OffloadTimes.of(problem, offload).rounding

    def done(verdict: str, reason: str, schedule: Schedule | None = None) -> Probe:
        seconds = time.perf_counter() - started
        return Probe(size, verdict, reason, seconds, peak, bound, schedule)

    if bound > memory:
        return done(DOES_NOT_FIT, f"no schedule peaks below {bound} B (the peak floor)")
    if checkpoint_all_peak(problem) <= memory:  # no recomputation: within every cap
        limit = max(deadline.remaining(), 0.05)
        plain = solve(graph, memory, time_limit=limit, workers=workers, deadline=deadline)
        peak = plain.peak
        reason = f"computing every node once peaks at {peak} B"
        return done(FITS, reason, _checked(graph, plain, memory, cap))
    if offload is None:
        limit = max(shares.probe_least_peak * deadline.remaining(), 0.05)
        least = solve(
            graph,
            objective="memory",
            compute_budget=compute_budget,
            time_limit=limit,
            workers=workers,
            deadline=deadline,
        )
        peak, bound = least.peak, int(least.bound) if least.bound is not None else bound
        if peak <= memory:
            return done(FITS, f"a schedule peaks at {peak} B", _checked(graph, least, memory, cap))
        if bound is not None and bound > memory:
            return done(DOES_NOT_FIT, f"the least peak within the cap is proven >= {bound} B")
    limit = max(deadline.remaining(), 0.05)
    try:
        cheapest = solve(
            graph, memory, time_limit=limit, workers=workers, deadline=deadline, offload=offload
        )
    except InfeasibleBudgetError as error:
        return done(DOES_NOT_FIT, f"no schedule peaks within {memory} B ({error})")
    except SolverTimeoutError as error:
        if cap is not None and error.cost_bound is not None and error.cost_bound - slack > cap:
            return done(DOES_NOT_FIT, _over_cap(error.cost_bound - slack, cap, memory))
        cost = "nothing within the memory found"
    else:
        if cap is None or cheapest.cost <= cap * (1 + 1e-12):
            peak = cheapest.peak if peak is None else min(peak, cheapest.peak)
            checked = _checked(graph, cheapest, memory, cap)
            return done(FITS, f"a schedule within {memory} B costs {cheapest.cost:g}", checked)
        if cheapest.bound is not None and cheapest.bound - slack > cap:
            return done(DOES_NOT_FIT, _over_cap(cheapest.bound - slack, cap, memory))
        cost = f"least cost within the memory in [{cheapest.bound:g}, {cheapest.cost:g}]"
    if offload is not None:
        return done(OPEN, f"peak floor {bound} B; with offload, {cost}")
    return done(OPEN, f"least peak within the cap in [{bound}, {peak}] B; {cost}")


def _over_cap(cost_bound: float, cap: float, memory: int) -> str:
    return f"every schedule within {memory} B costs >= {cost_bound:g} > the cap {cap:g}"


def _checked(graph: nx.DiGraph, schedule: Schedule, memory: int, cap: float | None) -> Schedule:
    """The schedule, after the simulator replays it (over its link, within the link's host
    limit) within `memory` and the cap (NOTE [fit proofs]); an internal error otherwise."""
    run = simulate(graph, schedule.ops, schedule.link)
    over = not run.valid or run.peak > memory
    if over or (cap is not None and run.cost > cap * (1 + 1e-12)):
        raise InternalError(
            f"a schedule replays at {run.peak} B, cost {run.cost:g}, outside {memory} B and "
            f"the cap {cap}"
        )
    return schedule


def largest_fitting(
    graph_at: Callable[[int], nx.DiGraph | None],
    memory: int | Callable[[int], int],
    *,
    compute_budget: float | str | None = None,
    low: int = 1,
    high: int | None = None,
    time_limit: float = 60.0,
    deadline: Deadline | None = None,
    workers: int = 8,
    progress: Callable[[Probe], None] | None = None,
    offload: Link | None = None,
    shares: FitShares = FIT_SHARES,
) -> FitResult:
    """The largest size s in [low, high] whose graph `graph_at(s)` has a schedule peaking at or
    under `memory` bytes within `compute_budget` (a factor like 1.3 or "1.3x" of computing
    every node once; None: unlimited), with a proof that s + 1 does not fit. `memory` may be a
    function of the size (bytes left to the step once what exists before it is counted); it
    must not grow with the size (NOTE [monotone sizes]).

    Doubling from `low` finds a size that does not fit (or reaches `high`); bisection then closes
    the interval. Each probe gets `shares.probe` of the time left (`probe`); `progress` sees each
    probe as it ends. `deadline`, where given, is used instead of `time_limit` (a search that
    is one step of a longer piece of work: its stop ends the search too); `graph_at` may return
    None where it cannot give the graph by then, which ends the search as the time limit does.
    `offload`: a host link; the schedules may then also copy values to the host and back over
    it (`probe`; NOTE [fit proofs]).
    With `offload`, keep/recompute is searched first (`shares.keep_recompute` of the time; it
    closes at once where it is easy): every size it shows to fit fits with offload too; the
    search with offload goes on from the size after its answer, and its proofs alone bound the
    answer (`probes`: the keep/recompute sizes that fit, then the sizes tried with offload).
    Returns a `FitResult` by the deadline: `proven` where the size after the answer is proven
    not to fit, else the interval the time left open.

    Raises ArgumentError for `low` < 0, `high` < `low` or a `memory` that grows with the size,
    GraphError for graphs that break NOTE [monotone sizes].

    Exception to the 8-parameter rule: the public entry point of the fit search (docs/fit.md);
    its keyword-only parameters are the search's options.
    """
    if low < 0 or (high is not None and high < low):
        raise ArgumentError(f"sizes must satisfy 0 <= low <= high, not low={low}, high={high}")
    started = time.perf_counter()
    deadline = Deadline(started + time_limit) if deadline is None else deadline
    question = _Question(graph_at, memory, compute_budget, high, workers, progress, shares)
    search = partial(_search, question)
    if offload is None:
        return search(low, deadline, None, started)
    kept = search(low, deadline.share(shares.keep_recompute), None, started)
    fits = [p for p in kept.probes if p.verdict == FITS]  # the others prove nothing here
    if kept.size is not None and high is not None and kept.size >= high:
        return replace(kept, probes=fits, seconds=time.perf_counter() - started)
    copied = search(low if kept.size is None else kept.size + 1, deadline, offload, started)
    best = copied.size if copied.size is not None else kept.size
    upper = copied.upper
    proven = upper is not None and upper == (low if best is None else best + 1)
    schedule = copied.schedule if copied.size is not None else kept.schedule
    seconds = time.perf_counter() - started
    return FitResult(best, upper, proven, schedule, fits + copied.probes, seconds)


@dataclass(frozen=True)
class _Question:
    """What `largest_fitting` asks, the same over each schedule space it searches (its
    parameters of those names)."""

    graph_at: Callable[[int], nx.DiGraph | None]
    memory: int | Callable[[int], int]
    compute_budget: float | str | None
    high: int | None
    workers: int
    progress: Callable[[Probe], None] | None
    shares: FitShares


def _search(
    question: _Question, low: int, deadline: Deadline, offload: Link | None, started: float
) -> FitResult:
    """`largest_fitting` over one schedule space: keep/recompute (`offload` None) or with
    offload over the link, from `low` (`started`: the call's start, `time.perf_counter`)."""
    graph_at, memory, compute_budget = question.graph_at, question.memory, question.compute_budget
    high, workers, progress = question.high, question.workers, question.progress
    probes: dict[int, Probe] = {}
    graphs: dict[int, nx.DiGraph] = {}

    memories: dict[int, int] = {}

    def run(size: int) -> Probe | None:
        graph = graph_at(size)
        if graph is None:
            return None
        _check_monotone(graphs, size, graph)
        graphs[size] = graph
        memories[size] = memory(size) if callable(memory) else memory
        _check_memory(memories, size)
        share = deadline.share(question.shares.probe)
        found = probe(
            graph,
            memories[size],
            compute_budget,
            share,
            size=size,
            workers=workers,
            offload=offload,
            shares=question.shares,
        )
        probes[size] = found
        if progress is not None:
            progress(found)
        return found

    best: int | None = None
    upper: int | None = None
    size = low
    while not deadline.passed():
        found = run(size)
        if found is None:
            break
        verdict = found.verdict
        if verdict == DOES_NOT_FIT:
            upper = size
            break
        if verdict == FITS:
            best = size
        if high is not None and size >= high:
            break
        size = max(size * 2, size + 1) if high is None else min(max(size * 2, size + 1), high)
    if upper is not None:

        def decide(size: int) -> str | None:
            found = None if deadline.passed() else run(size)
            return None if found is None else found.verdict

        undecided = [s for s, found in probes.items() if found.verdict == OPEN]
        fits, upper, _ = largest_between(
            decide, low - 1 if best is None else best, upper, undecided
        )
        best = None if fits < low else fits
    schedule = None if best is None else probes[best].schedule
    proven = upper is not None and upper == (low if best is None else best + 1)
    seconds = time.perf_counter() - started
    return FitResult(best, upper, proven, schedule, list(probes.values()), seconds)


def _check_memory(memories: dict[int, int], size: int) -> None:
    """NOTE [monotone sizes]: the memory left to the step never grows with the size."""
    for other, bytes_ in memories.items():
        if (other < size and bytes_ < memories[size]) or (other > size and bytes_ > memories[size]):
            raise ArgumentError(
                f"the memory left to the step grows from {min(bytes_, memories[size])} B to "
                f"{max(bytes_, memories[size])} B between sizes {min(other, size)} and "
                f"{max(other, size)}: it must not grow with the size"
            )


def _check_monotone(graphs: dict[int, nx.DiGraph], size: int, graph: nx.DiGraph) -> None:
    """NOTE [monotone sizes] between `graph` (at `size`) and the nearest graphs probed below and
    above it: the same nodes, edges and costs, and no node's bytes falling as the size grows."""
    below = [s for s in graphs if s < size]
    above = [s for s in graphs if s > size]
    pairs = ([(max(below), size)] if below else []) + ([(size, min(above))] if above else [])
    every = {**graphs, size: graph}
    for small, large in pairs:
        a, b = every[small], every[large]
        if set(a.nodes) != set(b.nodes) or set(a.edges) != set(b.edges):
            raise GraphError(f"the graphs at sizes {small} and {large} differ in nodes or edges")
        for v, attrs in a.nodes(data=True):
            other = b.nodes[v]
            if attrs["cost"] != other["cost"]:
                raise GraphError(f"node {v!r}'s cost differs between sizes {small} and {large}")
            for key in ("mem", "transient"):
                if attrs.get(key, 0) > other.get(key, 0):
                    raise GraphError(
                        f"node {v!r}'s {key} falls from {attrs.get(key, 0)} B at size {small} "
                        f"to {other.get(key, 0)} B at size {large}: the least peak must not fall "
                        "as the size grows"
                    )


def per_block_peak(graph: nx.DiGraph, cap: str | None) -> int | None:
    """The least peak (bytes) of checkpointing every module block of one depth, over the depths
    whose cost is within the compute cap (`cap`: text like "1.3x", None: unlimited); None where
    no depth is."""
    problem = prepare(graph)
    limit = None if cap is None else parse_compute_budget(cap, problem)
    modules = problem.module
    depth = max((m.count(".") + 1 for m in modules if m), default=0)
    peaks = []
    for d in range(1, depth + 1):
        schedule = block_checkpoint(problem, [_cut(m, d) for m in modules]).schedule
        if limit is None or schedule.cost <= limit * (1 + 1e-12):
            peaks.append(schedule.peak)
    if depth == 0:  # no module blocks: nothing is checkpointed, within every cap
        return checkpoint_all_peak(problem)
    return min(peaks, default=None)


def _cut(module: str, depth: int) -> str | None:
    """The module path cut to `depth` parts; None where it is shorter (no block)."""
    if not module or module.count(".") < depth - 1:
        return None
    return ".".join(module.split(".")[:depth])


class SizedSource(Protocol):
    """Where a search's graphs come from (`executor.fitting.graphs.SizedGraphs`): `captures`
    holds the sizes captured; with `affine`, the other sizes' graphs are predicted from them."""

    captures: Mapping[int, object]
    affine: bool

    def expected_seconds(self, size: int) -> float:
        """Seconds a capture at `size` is expected to take."""
        ...

    def refute(self, size: int) -> bool:
        """Capture `size`: whether the capture differs from the prediction."""
        ...


def confirmed(
    search: Callable[[], FitResult],
    graphs: SizedSource,
    dim: str,
    low: int,
    deadline: Deadline,
    notes: list[str],
) -> FitResult:
    """`search()`'s answer counting only probes decided on a captured graph.

    A probe decided on the affine prediction counts once its size is captured and the capture
    is the predicted graph (then its proof holds on it). The answer and its upper bound are
    captured where the deadline leaves time; where a capture refutes the prediction, `search()`
    runs again (over captures then) and its answer is taken. What was not captured is noted in
    `notes` (in `dim` units)."""
    found = search()
    captured = {p.size for p in found.probes if p.size in graphs.captures}
    for size in (found.size, found.upper):
        if not graphs.affine or size is None or size in captured:
            continue
        if not deadline.leaves(graphs.expected_seconds(size)):
            notes.append(
                f"{dim} {size} was decided on the affine prediction and not captured by the "
                "deadline: it is not counted"
            )
            continue
        if graphs.refute(size):  # the prediction is wrong there: no answer rests on it
            notes.append(
                f"the capture at {dim} {size} differs from the affine prediction: searched "
                "again over captures"
            )
            found = search()
            captured = {p.size for p in found.probes}
            break
        captured.add(size)
    probes = [p for p in found.probes if p.size in captured]
    size = max((p.size for p in probes if p.verdict == FITS), default=None)
    upper = min(
        (p.size for p in probes if p.verdict == DOES_NOT_FIT and p.size > (size or 0)), default=None
    )
    proven = upper is not None and upper == (low if size is None else size + 1)
    schedule = None if size is None else next(p.schedule for p in probes if p.size == size)
    return FitResult(size, upper, proven, schedule, found.probes, found.seconds)
