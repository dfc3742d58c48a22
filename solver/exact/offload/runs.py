"""The heuristic runs an offload solve starts from and keeps its incumbent among
(`solver.exact.offload.search`): the keep/recompute schedule as a run, the cheapest run that
fits, and what the runs found."""

from __future__ import annotations

import networkx as nx

from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import OffloadPlan
from solver.core.schedule import Schedule
from solver.core.stages import plan_from_ops
from solver.deadline import Deadline
from solver.heuristics.offload import OffloadRun, offload_runs


def from_start(
    graph: nx.DiGraph,
    problem: Problem,
    budget: int,
    link: Link,
    start: Schedule,
    deadline: Deadline,
) -> list[OffloadRun]:
    """The keep/recompute schedule `start` as a run without copies, and the offload heuristics
    (`solver.heuristics.offload`) from its plan."""
    plan = plan_from_ops(problem, start.ops)
    ops = tuple((kind, problem.index[v]) for kind, v in start.ops)
    none = OffloadPlan(plan, (frozenset(),) * problem.n, frozenset())
    run = OffloadRun("keep/recompute", none, ops, True, start.peak, start.cost)
    return [run, *offload_runs(graph, problem, budget, link, {"keep/recompute": plan}, deadline)]


def found_facts(runs: list[OffloadRun], incumbent: OffloadRun | None) -> dict[str, object]:
    """What the offload heuristics found, for `extra["steps"]`: how many runs there are, and
    the incumbent's cost and who found it (None where no run fits)."""
    if incumbent is None:
        return {"runs": len(runs), "cost": None, "found_by": None}
    return {"runs": len(runs), "cost": incumbent.cost, "found_by": incumbent.param}


def cheapest(runs: list[OffloadRun], budget: int) -> OffloadRun | None:
    """The cheapest run within `budget` bytes (ties: the lower peak), or None."""
    return min((r for r in runs if r.fits(budget)), key=lambda r: (r.cost, r.peak), default=None)


def at_compute_cost(run: OffloadRun | None, problem: Problem) -> bool:
    """Whether `run` costs no more than computing every node once (the simulator's cost is the
    computes' sum plus the stall, so it has no stall and recomputes nothing that costs): every
    schedule computes each node at least once, so none costs less."""
    return run is not None and run.cost <= problem.total_cost
