"""Solving a `LinearModel` as a MIP with HiGHS's branch and cut: fixed variables, objective cap.

Where the LP relaxation is close to the incumbent (MobileNet, ResNet50), LP-based branch and cut
refutes objective caps much faster than CP-SAT; where the LP is weak (op-level graphs) CP-SAT's
search is the better engine, and `solver.exact.probes` picks by the LP gap and the model size
(docs/solver.md, "Probes").

HiGHS works in floating point: a solution it returns is checked exactly by the caller before it
is believed (`solver.exact.probes` replays it in the simulator); the dual bound it states while
it runs is read through `solver.milp.units.safe_floor`, and its verdicts at the integer cap
(infeasible, optimal) are read as they are (NOTE [safe bounds], `ModelResult.proven`).
"""

from __future__ import annotations

import contextlib
import math
import threading

import highspy
import numpy as np

from solver.deadline import Deadline
from solver.milp.lp import ScaledLp, quiet_highs, scaled_lp
from solver.milp.model import LinearModel, ModelResult

MipQuestion = tuple[dict[int, int], int]
"""One question for `HighsMip.solve_all`: the fixed 0/1 variables and the objective cap."""


class HighsMip:
    """A `LinearModel` (objective: recompute cost) as a HiGHS MIP, solved any number of times,
    each time with its own fixed 0/1 variables and objective cap.

    The 0/1 variables (`LinearModel.binaries`) are integral; the stage model's memory levels U are
    continuous, which is exact: each is a sum of whole byte counts times 0/1 variables. The
    cascade cover's model has 0/1 variables only.
    """

    def __init__(
        self, lm: LinearModel, scaled: ScaledLp | None = None, *, presolve: bool = True
    ) -> None:
        """`scaled`: `lm` as `solver.milp.lp.scaled_lp` built it (the LP relaxation's, reused to
        save its build; this MIP changes it from now on), or None to build it here. `presolve`:
        HiGHS's MIP presolve, which does not look at the time limit while it runs (on the stage
        model of GPT-2 with two layers, 79k variables, it took 17 s of a 15 s limit, and the
        probe ended at 22 s): off for the stage model's probes (`solver.exact.probes.climb`)."""
        self.lm = lm
        self._presolve = presolve
        scaled = scaled or scaled_lp(lm)
        self._lp, self._col = scaled.lp, scaled.col
        self._cap_scale = float(scaled.row_scale[-1])
        self._lower = np.asarray(self._lp.col_lower_, float)
        self._upper = np.asarray(self._lp.col_upper_, float)
        self._row_upper = np.asarray(self._lp.row_upper_, float)
        integral = np.zeros(len(lm.names), bool)
        integral[lm.binaries] = True
        self._lp.integrality_ = [
            highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
            for flag in integral
        ]

    def solve(
        self, *, deadline: Deadline, fixed: dict[int, int], objective_cap: int
    ) -> ModelResult:
        """Minimise the objective subject to objective <= objective_cap with `fixed` pinned (0/1
        variables, whose scale is 1), by `deadline`."""
        return self.solve_all([(fixed, objective_cap)], deadline=deadline)[0]

    def solve_all(self, probes: list[MipQuestion], *, deadline: Deadline) -> list[ModelResult]:
        """`solve` for each probe, all at once, one thread each (HiGHS runs outside Python's
        lock, so two probes on two cores take about as long as one)."""
        solvers = [self._prepare(fixed, cap, deadline.remaining()) for fixed, cap in probes]
        with contextlib.ExitStack() as cancels:
            for highs in solvers:
                highs.HandleUserInterrupt = True  # `cancelSolve` ends the run
                cancels.enter_context(deadline.on_stop(highs.cancelSolve))
            if len(solvers) == 1:
                solvers[0].run()
            else:
                threads = [threading.Thread(target=highs.run) for highs in solvers]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        return [self._result(highs, cap) for highs, (_, cap) in zip(solvers, probes, strict=True)]

    def _prepare(
        self, fixed: dict[int, int], objective_cap: int, time_limit: float
    ) -> highspy.Highs:
        """A Highs instance holding the model with `fixed` pinned and the cap set, ready to run
        (made here, in the calling thread: `quiet_highs` redirects the process's stdout)."""
        lower, upper = self._lower.copy(), self._upper.copy()
        if fixed:
            index = np.fromiter(fixed, np.int64, len(fixed))
            value = np.fromiter(fixed.values(), float, len(fixed))
            lower[index] = upper[index] = value
        row_upper = self._row_upper.copy()
        row_upper[-1] = objective_cap / self._cap_scale
        self._lp.col_lower_, self._lp.col_upper_, self._lp.row_upper_ = lower, upper, row_upper
        highs = quiet_highs()
        for option, setting in (
            ("output_flag", False),
            ("time_limit", max(0.01, float(time_limit))),
            ("mip_rel_gap", 0.0),  # the default 1e-4 would stop short of the optimum
            ("mip_abs_gap", 0.5),  # the objective is whole: a gap below 1 closes it
            ("objective_bound", objective_cap + 0.5),  # prune nodes above the cap from the start
            ("presolve", "choose" if self._presolve else "off"),  # "choose": HiGHS's default
        ):
            highs.setOptionValue(option, setting)
        highs.passModel(self._lp)  # HiGHS copies the model: the next probe may change it
        return highs

    def _result(self, highs: highspy.Highs, cap: int) -> ModelResult:
        status, info = highs.getModelStatus(), highs.getInfo()
        if status == highspy.HighsModelStatus.kInfeasible:
            return ModelResult("INFEASIBLE", None, None, 0.0)
        bound = info.mip_dual_bound
        bound = max(0.0, bound) if math.isfinite(bound) else 0.0  # costs are never negative
        if info.primal_solution_status != 2:  # no feasible solution
            return ModelResult("UNKNOWN", None, None, bound)
        values = np.rint(np.asarray(highs.getSolution().col_value) * self._col).astype(np.int64)
        objective = round(info.objective_function_value)
        if status == highspy.HighsModelStatus.kOptimal:
            return ModelResult("OPTIMAL", values.tolist(), objective, bound)
        return ModelResult("FEASIBLE", values.tolist(), objective, bound)
