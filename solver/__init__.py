"""remat's solver: exact optimal rematerialization schedules on a DAG, heuristics, the schedule
format and an independent simulator. Never imports torch.

Packages, one concept each: `core` (the graph contract, the semantics and their simulator,
stage plans, the schedule format, budgets), `heuristics` (every schedule family, one registry),
`milp` (the 0/1 models and their engines: CP-SAT, HiGHS), `exact` (the search that proves
optimality). docs/solver.md describes each.
"""

from solver.core.budget import Budget, checkpoint_all_peak, parse_budget, parse_compute_budget
from solver.core.graph import Problem, prepare
from solver.core.link import Link, LinkError
from solver.core.schedule import Schedule
from solver.core.simulate import Simulation, simulate
from solver.deadline import Deadline
from solver.errors import (
    ArgumentError,
    BudgetError,
    ComputeBudgetError,
    DeadlineError,
    GraphError,
    InfeasibleBudgetError,
    InternalError,
    InvalidPlanError,
    InvalidScheduleError,
    RematError,
    ScheduleMismatchError,
    SolverTimeoutError,
    SpellingError,
)
from solver.exact import SolveOptions, solve
from solver.fitting.static import StaticBytesError
from solver.heuristics.baselines import BASELINES
from solver.heuristics.registry import HEURISTICS, baseline, evict
from solver.heuristics.rotor import NotAChainError
from solver.sac.windows import WindowError
from solver.target.devices import DeviceError, UnknownTargetError
from solver.time_shares import (
    CompileShares,
    EstimateShares,
    FitShares,
    RematerializeShares,
    SacShares,
    TimeShares,
)

__all__ = [
    "BASELINES",
    "HEURISTICS",
    "ArgumentError",
    "Budget",
    "BudgetError",
    "CompileShares",
    "ComputeBudgetError",
    "Deadline",
    "DeadlineError",
    "DeviceError",
    "EstimateShares",
    "FitShares",
    "GraphError",
    "InfeasibleBudgetError",
    "InternalError",
    "InvalidPlanError",
    "InvalidScheduleError",
    "Link",
    "LinkError",
    "NotAChainError",
    "Problem",
    "RematError",
    "RematerializeShares",
    "SacShares",
    "Schedule",
    "ScheduleMismatchError",
    "Simulation",
    "SolveOptions",
    "SolverTimeoutError",
    "SpellingError",
    "StaticBytesError",
    "TimeShares",
    "UnknownTargetError",
    "WindowError",
    "baseline",
    "checkpoint_all_peak",
    "evict",
    "parse_budget",
    "parse_compute_budget",
    "prepare",
    "simulate",
    "solve",
]
