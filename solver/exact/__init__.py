"""The exact search: `solve` as a pipeline of steps over one search state (`pipeline`,
`state`), its tuning (`options`, with how its seconds are shared out: `SolveOptions.shares`), and
the steps (`warm_start`, `cover`, `moments`, `stage_model`, `probes`; objective "memory":
`least_peak`; `infeasible`)."""

from solver.exact.options import SolveOptions
from solver.exact.pipeline import COST_STEPS, solve

__all__ = ["COST_STEPS", "SolveOptions", "solve"]
