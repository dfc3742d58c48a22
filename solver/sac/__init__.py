"""Selective-checkpoint (SAC) plans: which blocks run inside `torch.utils.checkpoint` and, in
each, which dispatched ops are saved (MUST_SAVE) or recomputed (MUST_RECOMPUTE), chosen for the
least recompute seconds under a peak-bytes budget. Torch-free: `executor.sac` records the
`SacProblem` and applies the plan. docs/sac.md states the memory model.
"""

from solver.sac.memory import SacPlan, plan_cost, plan_peak
from solver.sac.problem import SacBlock, SacOp, SacProblem, Segment
from solver.sac.solve import SacSolution, solve_sac

__all__ = [
    "SacBlock",
    "SacOp",
    "SacPlan",
    "SacProblem",
    "SacSolution",
    "Segment",
    "plan_cost",
    "plan_peak",
    "solve_sac",
]
