"""Shared helpers for the solver tests: where the published graphs are (../shared/graphs, used by
path and skipped when absent), the check that a heuristic's plan is what it claims, and the
options that take the read-gap cover out of the exact solver (tests of the stage-model paths,
which the cover would otherwise short-cut where it is tight)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from solver_reference import min_cost_within, stage_space_frontier

import solver
from solver import SolveOptions
from solver.core.simulate import simulate
from solver.exact.probes import probes
from solver.exact.stage_model import stage_model
from solver.heuristics.registry import all_policies
from solver.milp.lp import DualBound

GRAPHS = Path(__file__).resolve().parents[2] / "shared" / "graphs"
RANDOM_250 = GRAPHS / "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json"

NO_COVER = SolveOptions(cover=False)
"""The exact solver without the read-gap cover."""


def check_within(graph, problem, budget: int, member) -> None:
    """None (the heuristic found nothing), or a schedule the independent simulator accepts
    within the budget, at the peak and cost the plan reports."""
    if member is None:
        return
    replay = simulate(graph, [(kind, problem.ids[i]) for kind, i in member.schedule.ops])
    replay.raise_if_invalid()
    assert replay.peak == member.schedule.peak <= budget
    assert abs(replay.cost - member.schedule.cost) < 1e-9


def steps_run(schedule) -> list[str]:
    """The names of the steps the exact search ran for `schedule`, in order."""
    return [record["step"] for record in schedule.extra["steps"]]


def poor_incumbent(search):
    """Step: the most expensive policy schedule within the budget as the only warm start, so
    that the probes (not the warm start) have to find the optimum."""
    fitting = [
        m
        for m in all_policies(search.problem, each_use=True)
        if m.schedule.peak <= search.goal.budget
    ]
    search.offer(max(fitting, key=lambda m: m.schedule.cost, default=None))
    search.moments_ran = True  # no relaxation before the probes: they close the gap alone
    return search


def useless_lp(search):
    """Step: a valid but useless relaxation: bound 0 (costs are never negative), nothing fixed."""
    search.lp = lp_bound(0, len(search.model.names))
    return search


def lp_bound(bound: int, size: int) -> DualBound:
    """An LP bound of `bound` on a model of `size` variables, with nothing to fix."""
    zeros = np.zeros(size)
    return DualBound(bound, float(bound), zeros, zeros, zeros.astype(bool), values=zeros)


FORCED_PROBES = SolveOptions(
    steps=(poor_incumbent, stage_model, useless_lp, probes), cover=False, mip_min_variables=0
)
"""The search reduced to the probes, from the worst incumbent and a bound of 0."""


def probes_reach_the_optimum(graph, budgets, statuses: dict[str, list[str]]) -> None:
    """At each budget where a schedule fits, both probe engines, forced to close the whole gap
    alone (`FORCED_PROBES`: every probe on HiGHS, then every probe on CP-SAT), end OPTIMAL at
    the exhaustive optimum; the statuses of their runs are added to `statuses`."""
    frontier = stage_space_frontier(graph)
    for budget in budgets:
        expected = min_cost_within(frontier, budget)
        if expected is None:
            continue
        for gap in (1.0, -1.0):
            options = replace(FORCED_PROBES, mip_gap=gap)
            schedule = solver.solve(graph, budget, time_limit=30, options=options)
            assert schedule.status == "OPTIMAL"
            assert schedule.cost == pytest.approx(expected, rel=1e-12)
            assert solver.simulate(graph, schedule.ops).peak <= budget
            for record in schedule.extra["steps"]:
                statuses["highs"] += [status for _, status in record.get("highs_probes", ())]
                statuses["cpsat"] += [record["cpsat"]] if "cpsat" in record else []
