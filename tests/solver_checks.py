"""Shared helpers for the solver tests: where the published graphs are (../shared/graphs, used by
path and skipped when absent), the check that a heuristic's plan is what it claims, and the
options that take the read-gap cover out of the exact solver (tests of the stage-model paths,
which the cover would otherwise short-cut where it is tight)."""

from __future__ import annotations

from pathlib import Path

from solver import SolveOptions
from solver.core.simulate import simulate

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
