"""Solving a `LinearModel` with CP-SAT: hints, fixed variables, an objective cap, progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from solver.deadline import Deadline
from solver.milp.model import LinearModel, ModelResult

ProgressFn = Callable[[float, float, float], None]
"""Called on each improving solution with (seconds, objective, bound)."""

_OPEN = 2**62

OVERRUN_PER_VARIABLE = 2.5e-5
"""Seconds CP-SAT runs past its max_time_in_seconds per model variable (loading the model, a
last presolve), kept in hand so that the caller's deadline holds; a model whose translation
would leave less than that is not solved at all. Measured by `python -m
benchmarks.solving.time_limits`
(wall time against the time limit)."""

OVERRUN_SHARE = 0.01
"""Share of its own time limit CP-SAT runs past it beyond OVERRUN_PER_VARIABLE, also kept in
hand (long solves of large relaxations overran by about that)."""


# NOTE [presolve time]: CP-SAT's presolve runs its dominance detection to the end whatever its
# time limit: on the read-gap cover of a 72-layer Llama at 50% (6.9k variables, 4.8M terms) it
# ran 67 s of a 10 s limit, and `stop_search` sent at 5 s ended the call at 68 s. A caller whose
# model may be that large solves it without presolve (`solver.milp.cover`).


def print_progress(seconds: float, objective: float, bound: float) -> None:
    """A ProgressFn that writes one line per improving solution to stderr."""
    print(f"  [{seconds:7.2f}s] incumbent {objective:.6g}  bound {bound:.6g}", file=sys.stderr)


class Progress(cp_model.CpSolverSolutionCallback):
    """CP-SAT's solution callback reporting (wall seconds, objective, best bound) to
    ``report`` at each solution found."""

    def __init__(self, report: ProgressFn) -> None:
        super().__init__()
        self._report = report

    def on_solution_callback(self) -> None:
        self._report(self.wall_time, self.objective_value, self.best_objective_bound)


class CpSatModel:
    """A `LinearModel` translated into CP-SAT once and solved any number of times, each time
    with its own fixed variables, objective cap and hint (the exact solver's probes).

    Translating is the slow part in Python (seconds for a few hundred thousand variables); each
    solve copies the translation (a small share of that) and changes variable domains and the
    cap's bounds in the copy.
    """

    def __init__(self, lm: LinearModel) -> None:
        self.lm = lm
        self._model: cp_model.CpModel | None = None
        self._cap = -1  # index of the constraint objective <= cap

    def _translate(self, deadline: Deadline) -> bool:
        """Build the CP-SAT model; False when the deadline passes first, or as soon as the rate
        so far says it would.

        Rows go into the model's proto directly: about twice as fast as `add_linear_constraint`
        with linear expressions."""
        lm = self.lm
        m = cp_model.CpModel()
        proto = m.proto
        started, work = time.perf_counter(), len(lm.names) + len(lm.rows)
        reserve = OVERRUN_PER_VARIABLE * len(lm.names)

        def out_of_time(done: int) -> bool:
            """Whether the deadline has passed or will before the rest of the work (variables
            and rows, a row counted as a variable: rows cost more, so this errs late) and
            CP-SAT's overrun are done."""
            rest = (time.perf_counter() - started) * (work - done) / done if done else 0.0
            return not deadline.leaves(rest + reserve)

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
        deadline: Deadline,
        workers: int,
        hint: dict[int, int] | None = None,
        fixed: dict[int, int] | None = None,
        objective_cap: int | None = None,
        progress: ProgressFn | None = None,
        presolve: bool = True,
    ) -> ModelResult:
        """Minimise the objective by `deadline` (translation included); `fixed` pins variables,
        `objective_cap` adds objective <= cap. `progress` gets the objective and bound in the
        model's units. `presolve` False skips CP-SAT's presolve, which checks neither its time
        limit nor `stop_search` in every pass (NOTE [presolve time])."""
        if self._model is None and not self._translate(deadline):
            return ModelResult("UNKNOWN", None, None, 0.0, exact=True)  # out of time translating
        assert self._model is not None
        m = self._model.clone()
        for idx, value in (fixed or {}).items():
            if not self.lm.lower[idx] <= value <= self.lm.upper[idx]:
                return ModelResult("INFEASIBLE", None, None, 0.0, exact=True)
            domain = m.proto.variables[idx].domain
            domain[0], domain[1] = value, value
        if objective_cap is not None:
            m.proto.constraints[self._cap].linear.domain[1] = objective_cap
        for var, value in (hint or {}).items():
            m.proto.solution_hint.vars.append(var)
            m.proto.solution_hint.values.append(value)
        solver = configured_solver(deadline, len(self.lm.names), workers, presolve)
        if solver is None:
            return ModelResult("UNKNOWN", None, None, 0.0, exact=True)  # would end past the limit
        callback = Progress(progress) if progress else None
        with deadline.on_stop(solver.stop_search):
            status = solver.solve(m, callback)
        name = solver.status_name(status)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            values = list(solver.response_proto.solution)
            return ModelResult(
                name, values, round(solver.objective_value), solver.best_objective_bound, True
            )
        bound = solver.best_objective_bound if name == "UNKNOWN" else 0.0
        return ModelResult(name, None, None, bound, exact=True)


def configured_solver(
    deadline: Deadline, variables: int, workers: int, presolve: bool = True
) -> cp_model.CpSolver | None:
    """A CP-SAT solver for a model of `variables` variables that ends by `deadline` (its time
    limit less the overrun CP-SAT is measured to take past it: `OVERRUN_PER_VARIABLE` per
    variable and `OVERRUN_SHARE` of the time left), or None where that leaves no time.

    Linearising the memory constraints for the LP workers tightens the bound, and one presolve
    pass without probing shortens the proofs on the stage models (docs/solver.md, "CP-SAT";
    `python -m benchmarks.solving.solver_scale`; the full presolve's dual strengthening took
    10 s of VGG16's 90% solve); `presolve` False skips it. Ctrl-C is the solve's to handle
    (`solver.interrupt`): CP-SAT's own handler would end this call only, and the next step
    would run on."""
    left = deadline.remaining()
    overrun = OVERRUN_PER_VARIABLE * variables + OVERRUN_SHARE * left
    if left <= overrun:
        return None
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = left - overrun
    solver.parameters.num_workers = workers
    solver.parameters.linearization_level = 2
    solver.parameters.max_presolve_iterations = 1
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.cp_model_presolve = presolve
    solver.parameters.catch_sigint_signal = False
    return solver
