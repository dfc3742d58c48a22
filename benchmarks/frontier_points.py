"""The memory/compute frontier: the exact solver and every heuristic over a list of budgets
(the frontier benchmarks' points, `benchmarks.common.predicted_frontier`)."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from solver.core.budget import parse_budget
from solver.core.graph import prepare
from solver.core.stages import cheapest_within
from solver.errors import ArgumentError, InfeasibleBudgetError, SolverTimeoutError
from solver.exact import solve
from solver.heuristics.registry import HEURISTICS, members


@dataclass(frozen=True)
class FrontierPoint:
    """One (method, budget) result. `cost`/`peak` are None when the method cannot fit the budget.

    budget and peak are bytes; cost is in the graph's cost unit; seconds is solve time.
    """

    method: str
    budget: int
    cost: float | None
    peak: int | None
    status: str
    gap: float | None
    seconds: float


def frontier(
    graph: nx.DiGraph,
    budgets: list[int | str],
    *,
    methods: list[str] | None = None,
    time_limit: float = 60.0,
    workers: int = 8,
) -> list[FrontierPoint]:
    """Solve every budget with the exact solver and each heuristic (all that apply by default).

    `methods` picks among "exact" and the names of `solver.HEURISTICS` (rotor applies to the
    training graphs of short chains only). Policy families are evaluated once and filtered per
    budget; the heuristics run at a budget (eviction, backward) run at each. A method that
    cannot fit a budget gives a point with status "INFEASIBLE" (exact: proven), "TIMEOUT"
    (exact: nothing found in time) or "NO FIT" (heuristic) and cost None.
    """
    problem = prepare(graph)
    applicable = [h.name for h in HEURISTICS.values() if h.applies(problem)]
    names = methods or ["exact", *applicable]
    unknown = set(names) - {"exact", *applicable}
    if unknown:
        raise ArgumentError(
            f"unknown or inapplicable methods {sorted(unknown)}: choose from this graph's "
            f"{', '.join(['exact', *applicable])}"
        )
    chosen = [name for name in names if name != "exact"]
    policies = members(problem, None, [n for n in chosen if not HEURISTICS[n].at_budget])
    points = []
    for raw in budgets:
        budget = parse_budget(raw, problem)
        if "exact" in names:
            points.append(_exact_point(graph, budget, time_limit, workers))
        at_budget = members(problem, budget, [n for n in chosen if HEURISTICS[n].at_budget])
        for name in chosen:
            best = cheapest_within({**policies, **at_budget}[name], budget)
            if best is None:
                points.append(FrontierPoint(name, budget, None, None, "NO FIT", None, 0.0))
            else:
                schedule = best.schedule
                point = FrontierPoint(
                    name, budget, schedule.cost, schedule.peak, "FEASIBLE", None, 0.0
                )
                points.append(point)
    return points


def _exact_point(graph: nx.DiGraph, budget: int, time_limit: float, workers: int) -> FrontierPoint:
    try:
        s = solve(graph, budget, time_limit=time_limit, workers=workers)
    except InfeasibleBudgetError:
        return FrontierPoint("exact", budget, None, None, "INFEASIBLE", None, 0.0)
    except SolverTimeoutError:
        return FrontierPoint("exact", budget, None, None, "TIMEOUT", None, 0.0)
    return FrontierPoint("exact", budget, s.cost, s.peak, s.status, s.gap, s.solve_seconds)
