"""The exact search: `solve` as a pipeline of steps over one search state (`pipeline`,
`state`), its tuning (`options`; how its seconds are shared out, `time_shares`), and the steps
(`warm_start`, `cover`, `moments`, `stage_model`, `probes`; objective "memory": `least_peak`;
`infeasible`)."""

from solver.exact.options import SolveOptions
from solver.exact.pipeline import COST_STEPS, solve
from solver.exact.time_shares import TimeShares

__all__ = ["COST_STEPS", "SolveOptions", "TimeShares", "solve"]
