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

Each verdict rests on NOTE [fit proofs] (`solver.fitting.probe`).

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
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import networkx as nx

from solver.core.link import Link
from solver.core.schedule import Schedule
from solver.deadline import Deadline
from solver.errors import ArgumentError, GraphError
from solver.fitting.probe import Probe, probe
from solver.fitting.sizes import DOES_NOT_FIT, FITS, OPEN, largest_between
from solver.time_shares import FIT_SHARES, FitShares


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
