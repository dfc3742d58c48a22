"""One size's verdict (`probe`): whether a training step's graph has a schedule within a memory
and a compute cap ("fits"), is proven to have none ("does not fit"), or is left "open" by the
deadline.

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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import networkx as nx

from solver.core.budget import checkpoint_all_peak, parse_compute_budget
from solver.core.graph import prepare
from solver.core.link import Link
from solver.core.schedule import Schedule
from solver.core.simulate import simulate
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, InternalError, SolverTimeoutError
from solver.exact import solve
from solver.fitting.sizes import DOES_NOT_FIT, FITS, OPEN
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
