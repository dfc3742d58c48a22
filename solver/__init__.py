"""remat's solver: exact optimal rematerialization schedules on a DAG, baselines, the schedule
format and an independent simulator. Never imports torch."""

from solver.baselines import BASELINES, baseline
from solver.budget import checkpoint_all_peak, parse_budget, parse_compute_budget
from solver.errors import (
    ComputeBudgetError,
    GraphError,
    InfeasibleBudgetError,
    InvalidScheduleError,
    RematError,
    ScheduleMismatchError,
    SolverTimeoutError,
)
from solver.eviction import evict
from solver.exact import minimum_peak, solve
from solver.graph import Problem, prepare
from solver.schedule import Schedule
from solver.simulate import Simulation, simulate

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
