"""remat's solver: exact optimal rematerialization schedules on a DAG, baselines, the schedule
format and an independent simulator. Never imports torch."""

from solver.core.budget import checkpoint_all_peak, parse_budget, parse_compute_budget
from solver.core.graph import Problem, prepare
from solver.core.schedule import Schedule
from solver.core.simulate import Simulation, simulate
from solver.errors import (
    ComputeBudgetError,
    GraphError,
    InfeasibleBudgetError,
    InvalidScheduleError,
    RematError,
    ScheduleMismatchError,
    SolverTimeoutError,
)
from solver.exact.pipeline import minimum_peak, solve
from solver.heuristics.baselines import BASELINES, baseline
from solver.heuristics.eviction import evict

__all__ = [
    "BASELINES",
    "ComputeBudgetError",
    "GraphError",
    "InfeasibleBudgetError",
    "InvalidScheduleError",
    "Problem",
    "RematError",
    "Schedule",
    "ScheduleMismatchError",
    "Simulation",
    "SolverTimeoutError",
    "baseline",
    "checkpoint_all_peak",
    "evict",
    "minimum_peak",
    "parse_budget",
    "parse_compute_budget",
    "prepare",
    "simulate",
    "solve",
]
