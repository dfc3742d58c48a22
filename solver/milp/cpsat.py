"""Solving a `LinearModel` with CP-SAT: hints, fixed variables, an objective cap, progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from solver.milp.formulation import LinearModel, ModelResult

ProgressFn = Callable[[float, float, float], None]
"""Called on each improving solution with (seconds, objective, bound) in graph units."""

_OPEN = 2**62

OVERRUN_PER_VARIABLE = 2.5e-5
"""Seconds CP-SAT runs past its max_time_in_seconds per model variable (loading the model, a
last presolve), kept in hand so that the caller's time limit holds: random_layered n=250 (192k
variables) stopped 1.6 s late, n=500 (0.93M variables, 3.8M rows) 12 s late, n=500's moment
relaxation (156k variables, 0.67M rows, with Python busy on another thread) 3.3 s late. A model
whose translation would leave less than that is not solved at all."""

OVERRUN_SHARE = 0.01
"""Share of its own time limit CP-SAT runs past it beyond OVERRUN_PER_VARIABLE, also kept in
hand: the same relaxation ended 4.5 s past a 600 s limit under the reserve per variable of
1.5e-5 s (2.3 s)."""


def print_progress(seconds: float, objective: float, bound: float) -> None:
    """A ProgressFn that writes one line per improving solution to stderr."""
    print(f"  [{seconds:7.2f}s] incumbent {objective:.6g}  bound {bound:.6g}", file=sys.stderr)


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, report: ProgressFn, scale: float, offset: float) -> None:
        super().__init__()
        self._report, self._scale, self._offset = report, scale, offset

    def on_solution_callback(self) -> None:
        self._report(
            self.wall_time,
            self.objective_value * self._scale + self._offset,
            self.best_objective_bound * self._scale + self._offset,
        )


class CpSatModel:
    """A `LinearModel` translated into CP-SAT once and solved any number of times, each time
    with its own fixed variables, objective cap and hint (the exact solver's probes).

    Translating is the slow part in Python (ResNet50's 217k variables and 517k rows: 2.7 s);
    each solve copies the translation (0.1 s) and changes variable domains and the
    cap's bounds in the copy.
    """

    def __init__(self, lm: LinearModel) -> None:
        self.lm = lm
        self._model: cp_model.CpModel | None = None
        self._cap = -1  # index of the constraint objective <= cap

    def _translate(self, deadline: float) -> bool:
        """Build the CP-SAT model; False when the deadline passes first, or as soon as the rate
        so far says it would (random_layered n=500, 0.93M variables and 3.8M rows, gave up after
        19.6 s at the deadline before; now after 2.5 s).

        Rows go into the model's proto directly: through `add_linear_constraint` and linear
        expressions ResNet50's model took 5-9 s, this way 2.7 s (FCN8: 0.14 -> 0.10 s)."""
        lm = self.lm
        m = cp_model.CpModel()
        proto = m.proto
        started, work = time.perf_counter(), len(lm.names) + len(lm.rows)
        reserve = OVERRUN_PER_VARIABLE * len(lm.names)

        def out_of_time(done: int) -> bool:
            """Whether the deadline has passed or will before the rest of the work (variables
            and rows, a row counted as a variable: rows cost more, so this errs late) and
            CP-SAT's overrun are done."""
            now = time.perf_counter()
            rest = (now - started) * (work - done) / done if done else 0.0
            return now + rest + reserve > deadline

        for count, (lo, hi, name) in enumerate(zip(lm.lower, lm.upper, lm.names, strict=True)):
            if count % 8192 == 0 and out_of_time(count):
                return False
            variable = proto.variables.add()
            variable.domain.extend((lo, hi))
            variable.name = name
        constraints = proto.constraints
        for count, (variables, coefs, lo, hi) in enumerate(lm.rows, start=len(lm.names)):
            if count % 8192 == 0 and out_of_time(count):
                return False
            row = constraints.add().linear
            row.vars.extend(variables)
            row.coeffs.extend(coefs)
            row.domain.extend((-_OPEN if lo is None else lo, _OPEN if hi is None else hi))
        self._cap = len(constraints)
        variables, coefs = list(lm.objective), list(lm.objective.values())
        cap = constraints.add().linear
        cap.vars.extend(variables)
        cap.coeffs.extend(coefs)
        cap.domain.extend((-_OPEN, _OPEN))
        proto.objective.vars.extend(variables)
        proto.objective.coeffs.extend(coefs)
        self._model = m
        return True

    def solve(
        self,
        *,
        time_limit: float,
        workers: int,
        hint: dict[int, int] | None = None,
        fixed: dict[int, int] | None = None,
        objective_cap: int | None = None,
        progress: ProgressFn | None = None,
        scale: float = 1.0,
        offset: float = 0.0,
    ) -> ModelResult:
        """Minimise the objective within `time_limit` seconds (translation included); `fixed`
        pins variables, `objective_cap` adds objective <= cap. `scale` and `offset` turn the
        integer objective into graph units for `progress` only."""
        started = time.perf_counter()
        if self._model is None and not self._translate(started + time_limit):
            return ModelResult("UNKNOWN", None, None, 0.0)  # out of time while translating
        assert self._model is not None
        m = self._model.clone()
        for idx, value in (fixed or {}).items():
            if not self.lm.lower[idx] <= value <= self.lm.upper[idx]:
                return ModelResult("INFEASIBLE", None, None, 0.0)
            domain = m.proto.variables[idx].domain
            domain[0], domain[1] = value, value
        if objective_cap is not None:
            m.proto.constraints[self._cap].linear.domain[1] = objective_cap
        for var, value in (hint or {}).items():
            m.proto.solution_hint.vars.append(var)
            m.proto.solution_hint.values.append(value)
        left = time_limit - (time.perf_counter() - started)
        overrun = OVERRUN_PER_VARIABLE * len(self.lm.names) + OVERRUN_SHARE * left
        if left <= overrun:
            return ModelResult("UNKNOWN", None, None, 0.0)  # it would end past the limit
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = left - overrun
        solver.parameters.num_workers = workers
        # Linearising the memory constraints for the LP workers tightened the bound: VGG19 80%
        # proved in 16 s instead of 28 s, FCN8 80% in 17 s instead of 21 s (loaded machine).
        solver.parameters.linearization_level = 2
        # One presolve pass and no probing: the stage models gain little from more, and the
        # proofs that follow are short (median of 3 runs, 8 workers: FCN8 80% 1.16 -> 0.71 s,
        # VGG19 80% 0.68 -> 0.37 s, FCN8 90% 0.75 -> 0.51 s; demo unet 50% proven in 34 s,
        # where the default presolve ended at the 60 s limit without a proof).
        solver.parameters.max_presolve_iterations = 1
        solver.parameters.cp_model_probing_level = 0
        callback = _Progress(progress, scale, offset) if progress else None
        status = solver.solve(m, callback)
        name = solver.status_name(status)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            values = list(solver.response_proto.solution)
            return ModelResult(
                name, values, round(solver.objective_value), solver.best_objective_bound
            )
        bound = solver.best_objective_bound if name == "UNKNOWN" else 0.0
        return ModelResult(name, None, None, bound)
