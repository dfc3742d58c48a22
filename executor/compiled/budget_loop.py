"""The budget loop of `executor.compile`: the byte budget held by the compiled step's peak,
measured under the compiling backend.

The budget holds by a bounded loop: solve at a solver budget, compile, measure the compiled
step's peak on the example inputs, and where it exceeds the budget solve again below the
schedule's predicted peak by the excess (doubled at each further miss), the last time at
"min" (the least-peak schedule), at most ``max_compiles`` times (`CompileReport.compiles`
counts them, the plain compile of a percentage's basis included). Where a schedule solved at
a solver budget recomputes an op that must run once (a random op whose draw does not replay,
or a mutation: `RematPartitioner`), the next compile is "min", whose least-peak search keeps
such ops once: returned where its measured peak is within the budget, else the error says
that least peak.

NOTE [one deadline]: ``time_limit`` bounds the whole call, compiles and measurements included,
as `solver.solve`'s does: one `Deadline` (with the first Ctrl-C's `Stop`) is made at the call.
The solves of each compile end by an equal share of the time left among the compiles left,
less what the rest of that compile and its measurement are expected to take (`_solve_seconds`;
"min" compiles once and solves as the first of two compiles would);
each compile starts only where the time left holds what the compiles before it took beyond
their solves (`expected_seconds`), each measurement only where it holds the measurements before
it. The model returned has its peak measured within the budget, its solves cut short by the
deadline reported (`CompileReport.stopped`); where the time runs out before such a model, the
call raises `CompileError` saying what was done and what ``time_limit`` the next step needs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import nn

import solver
from executor.check import CheckReport
from executor.compiled.check import CompileCheck, LossStep, check_compiled
from executor.compiled.partitioner import (
    LAYOUT,
    RegionPlan,
    RematPartitioner,
    _Infeasible,
    _RunsTwice,
    backend,
)
from executor.compiled.report import CompileReport, Try
from executor.compiled.step import StepMeasurement, compiled_call, fresh_call, measure_step
from executor.errors import CompileError
from executor.fitting.graphs import expected_seconds
from solver.core.budget import Budget, human_bytes
from solver.deadline import Deadline
from solver.errors import BudgetError
from solver.time_shares import COMPILE_SHARES, CompileShares


@dataclass
class CompiledSteps:
    """Compiles and measurements of ``model``'s step under one deadline, with their seconds."""

    model: nn.Module
    inputs: tuple[object, ...]
    kwargs: dict[str, object]
    loss_fn: Callable[[object], torch.Tensor]
    deadline: Deadline
    compiles: int = 0
    compile_seconds: dict[int, float] = field(default_factory=dict)  # beyond the solves
    measure_seconds: dict[int, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def rest(self) -> float | None:
        """Seconds a compile beyond its solves and its measurement are expected to take
        (None before any compile)."""
        if not self.compile_seconds:
            return None
        return expected_seconds(self.compile_seconds) + expected_seconds(self.measure_seconds)

    def measure(
        self, backend: Callable | str, partitioner: RematPartitioner | None
    ) -> tuple[Callable[..., Any], StepMeasurement]:
        """(the compiled call, `StepMeasurement`): ``model`` compiled by ``backend`` and measured,
        each where the deadline holds it (`CompileError` otherwise)."""
        rest = self.rest()
        if rest is not None and not self.deadline.leaves(rest):
            raise self.out_of_time(f"the next compile needs about {rest:.1f} s", rest)
        call = compiled_call(self.model, backend)
        self.compiles += 1
        try:
            measured: StepMeasurement = measure_step(
                self.model,
                call,
                self.inputs,
                self.kwargs,
                self.loss_fn,
                self.deadline,
                expected_seconds(self.measure_seconds),
            )
        except (CompileError, _Infeasible):
            raise
        except Exception as e:
            if partitioner is None:  # torch's own partition: the error is the model's
                raise
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise CompileError(
                f"the step compiled with remat's partition failed ({type(e).__name__}: "
                f"{first}); this is a defect in remat: report it with the model"
            ) from e
        solving = partitioner.solve_seconds if partitioner is not None else 0.0
        self.compile_seconds[self.compiles] = max(0.0, measured.compile_seconds - solving)
        if measured.peak is None:
            need = expected_seconds(self.measure_seconds) if self.measure_seconds else None
            raise self.out_of_time(f"compile {self.compiles} is not measured", need)
        self.measure_seconds[self.compiles] = measured.seconds
        return call, measured

    def out_of_time(self, what: str, need: float | None) -> CompileError:
        """The error when the deadline ends the call: what was done, what is next and what
        ``time_limit`` it would need (``need``: its seconds; None: not known)."""
        elapsed = time.perf_counter() - self.started
        why = "interrupted" if self.deadline.stopped() else "time limit"
        enough = f"above {elapsed:.0f} s" if need is None else f"of {elapsed + need:.0f} s or more"
        return CompileError(
            f"{why} after {self.compiles} compiles in {elapsed:.1f} s and no model to return; "
            f"{what}: a time_limit {enough} would allow it"
        )


class BudgetLoop:
    """``steps.model`` compiled by the backend ``name`` with inductor ``options`` and remat's
    partition, solved at ``wanted`` (offloading over ``link`` where one is given) and lowered
    until the measured peak is within it, at most ``max_compiles`` times, then held against
    torch's step (``check``): `run` returns the compiled call and its `CompileReport`, or
    raises `CompileError` where no compile measures within the budget in time; ``shares``: how
    the solves share the time (NOTE [one deadline]).

    A solver budget is bytes, or None for "min" (the least-peak schedule). ``tries``: the
    measured compiles; ``attempted``: the solver budget of every compile, measured or not;
    ``infeasible``: the last compile's solve, below the least; ``runs_twice``: a schedule
    refused for recomputing a run-once op; ``plain_peak``: the plain compile's measured peak
    (bytes), once a percentage needed it."""

    def __init__(
        self,
        steps: CompiledSteps,
        wanted: Budget,
        name: str,
        options: dict[str, Any],
        max_compiles: int,
        check: CompileCheck,
        link: solver.Link | None = None,
        shares: CompileShares = COMPILE_SHARES,
    ) -> None:
        self.steps, self.name, self.options = steps, name, options
        self.max_compiles, self.check, self.link = max_compiles, check, link
        self.shares = shares
        self.plain_peak: int | None = None
        self.budget, self.minimum = wanted.text, wanted.least
        try:
            self.target = None if self.minimum else wanted.bytes(self.hundred)
        except BudgetError as e:
            raise CompileError(str(e)) from e
        self.tries: list[Try] = []
        self.attempted: list[int | None] = []
        self.infeasible: _Infeasible | None = None
        self.runs_twice: _RunsTwice | None = None

    def hundred(self) -> int:
        """Bytes: the plain compile's measured peak (compiled and measured at the first call)."""
        if self.plain_peak is None:
            plain = self.name if not self.options else _plain(self.name, self.options)
            _, measured = self.steps.measure(plain, None)
            self.plain_peak = measured.peak
        return self.plain_peak

    def run(self) -> tuple[Callable[..., Any], CompileReport]:
        """(the compiled call, its `CompileReport`): the loop (module docstring)."""
        solver_budget: int | None = None if self.minimum else self.target
        for attempt in range(self.max_compiles):
            self.attempted.append(solver_budget)
            partitioner = self._partitioner(solver_budget, attempt)
            started = time.perf_counter()
            try:
                call, measured = self.steps.measure(
                    backend(self.name, partitioner, self.options), partitioner
                )
            except _Infeasible as e:
                solver_budget = self._after_infeasible(e, partitioner)
                if solver_budget in self.attempted:
                    break
                continue
            self.infeasible = None
            predicted = max(r.schedule.peak for r in partitioner.regions)
            seconds = time.perf_counter() - started
            self.tries.append(Try(solver_budget, predicted, measured.peak, seconds))
            if self.minimum or measured.peak <= self.target:
                return call, self._report(call, measured, partitioner)
            if solver_budget is None:
                break  # the least-peak schedule measured over the budget
            lowered = self._lowered(solver_budget, predicted, measured.peak)
            if (attempt == self.max_compiles - 2 or lowered <= 0) and None not in self.attempted:
                solver_budget = None
            elif lowered <= 0:
                break
            else:
                solver_budget = lowered
        self._fail()

    def _partitioner(self, solver_budget: int | None, attempt: int) -> RematPartitioner:
        """The partition of compile ``attempt``, its solves ending by their share of the time
        left (NOTE [one deadline])."""
        # "min" returns its first measured compile: its solves take a quarter of the time,
        # as the first of two compiles would, leaving the compile, whose seconds are not
        # known before it, and the measurement the rest
        # under inductor the check compiles torch's partition once more: a share of its own
        left = (2 if self.minimum else self.max_compiles - attempt) + (self.name == "inductor")
        deadline = self.steps.deadline
        seconds = _solve_seconds(deadline.remaining(), left, self.steps.rest(), self.shares)
        solves = deadline.within(seconds)
        return RematPartitioner(
            "min" if solver_budget is None else solver_budget,
            solves,
            replay_rng=self.name == "aot_eager",
            fuse=self.name == "inductor",
            link=self.link,
        )

    def _after_infeasible(self, e: _Infeasible, partitioner: RematPartitioner) -> int | None:
        """The next solver budget after a compile whose solve found no schedule (``e``)."""
        timed_out = isinstance(e.error, solver.SolverTimeoutError)
        refused = isinstance(e, _RunsTwice)
        if refused:
            self.runs_twice = e
        # a solve cut short finds no schedule, and one that recomputes an op that must run
        # once is refused: the least-peak one ("min") is within the budget wherever any
        # schedule is, in the model, its search keeps run-once ops once, and the
        # measurement decides
        next_budget = None if timed_out or refused else _above_least(e, self.target, self.tries)
        if timed_out and next_budget in self.attempted:
            raise CompileError(
                f"budget {self.budget} ({self.target} B): the solver found no schedule within "
                f"it in its {partitioner.solve_seconds:.1f} s share of time_limit "
                f"({str(e.error).splitlines()[0]}); raise time_limit or the budget"
            ) from e.error
        self.infeasible = e
        return next_budget

    def _lowered(self, solver_budget: int, predicted: int, measured: int) -> int:
        """The next solver budget (bytes; 0 or less: nothing left) after a compile that
        measured over the target."""
        # below the schedule's predicted peak (the solver budget may lie far above it) by the
        # excess, doubled at each further miss: inductor's peak moves in steps; the last
        # compile (or a budget lowered to nothing) is the least-peak schedule's, the likeliest
        # to measure within the budget where the model's peaks miss inductor's
        below = min(solver_budget, predicted)
        return below - (measured - self.target) * 2 ** (len(self.tries) - 1)

    def _report(
        self, call: Callable[..., Any], measured: StepMeasurement, partitioner: RematPartitioner
    ) -> CompileReport:
        """The report of the compile returned, checked against torch's step."""
        steps = self.steps
        checked = check_step(steps, call, self.name, self.options, partitioner.regions, self.check)
        stopped = "interrupted" if steps.deadline.stopped() else "time limit"
        return CompileReport(
            None if self.minimum else self.target,
            measured.peak,
            self.plain_peak,
            steps.compiles,
            self.tries,
            partitioner.regions,
            stopped if partitioner.cut_short else None,
            checked,
        )

    def _fail(self) -> NoReturn:
        """Raises the error where no compile measured within the budget."""
        budget, target, tries = self.budget, self.target, self.tries
        if self.runs_twice is not None:  # "min" followed it: over the budget, or not compiled
            error = _runs_once(budget, target, tries, self.runs_twice, self.max_compiles)
            raise error from self.runs_twice.error
        if self.infeasible is not None:
            raise _below_least(budget, target, tries, self.infeasible) from self.infeasible.error
        if tries[-1].solver_budget is None:
            raise CompileError(
                f"budget {budget} ({target} B) is below the least remat's partition reaches "
                f"compiled: its least-peak schedule measured {tries[-1].measured} B "
                f"({human_bytes(tries[-1].measured)}): raise the budget, use 'min', or compile "
                "without remat (torch's partition can measure lower where inductor's layout or "
                "fusion choices differ from remat's model)"
            )
        raise CompileError(
            f"budget {budget} ({target} B): after {len(tries)} compiles the compiled step still "
            f"measured {tries[-1].measured} B ({human_bytes(tries[-1].measured)}); raise the "
            f"budget or max_compiles"
        )


def check_step(
    steps: CompiledSteps,
    call: Callable[..., Any],
    name: str,
    options: dict[str, Any],
    regions: list[RegionPlan],
    check: CompileCheck,
) -> CheckReport:
    """`check_compiled` of ``call`` against eager (aot_eager) or torch's partition compiled with
    remat's inductor options, where the deadline leaves a compile for it."""
    if name == "aot_eager":
        reference, label = fresh_call(steps.model), "eager"
    else:
        rest = steps.rest() or 0.0
        if not steps.deadline.leaves(rest):
            raise steps.out_of_time(f"the check's compile needs about {rest:.1f} s", rest)
        reference = compiled_call(steps.model, _plain(name, {**LAYOUT, **options}))
        label = "torch's own partition compiled with the same options"
    random_ops = any(
        r.dag.nodes[v].get("once") and not r.dag.nodes[v].get("mutates")
        for r in regions
        for v in r.dag.nodes
    )
    return check_compiled(
        steps.model,
        call,
        reference,
        LossStep(steps.inputs, steps.kwargs, steps.loss_fn),
        exact=name == "aot_eager",
        options=check,
        reference_name=label,
        random_ops=random_ops,
    )


def _solve_seconds(left: float, tries: int, rest: float | None, shares: CompileShares) -> float:
    """Seconds for the solves of the next of ``tries`` compiles when ``left`` seconds remain
    and a compile beyond its solves, with its measurement, is expected to take ``rest`` (None:
    not known yet: the solves take ``shares.first_solves`` of a compile's equal share): an
    equal share of what the compiles leave, or where that is nothing, of what this one
    leaves."""
    if rest is None:
        return shares.first_solves * (left / tries)
    return max(left / tries - rest, (left - rest) / tries, 0.0)


def _plain(name: str, options: dict[str, Any]) -> Callable:
    """The backend ``name`` with inductor ``options`` and torch's own partition."""
    from torch._inductor.compile_fx import compile_fx

    if name != "inductor":
        raise CompileError(f"backend {name!r} takes no options")
    return functools.partial(compile_fx, config_patches=options)


def _above_least(e: _Infeasible, target: int, tries: list[Try]) -> int | None:
    """The next solver budget where ``target`` is below the least schedule's peak in the
    solver's model: the budget is about the measured peak, which the model overestimates by
    up to what the tries measured under their prediction, so the next try solves at the
    target raised by that overestimate, at least the model's least (None, "min", where the
    least is not known)."""
    least = getattr(e.error, "minimum_bytes", None)
    if least is None:
        return None
    over = max((t.predicted - t.measured for t in tries), default=0)
    return max(int(least), target + over)


def _below_least(
    budget: object, target: int | None, tries: list[Try], e: _Infeasible
) -> CompileError:
    least = getattr(e.error, "minimum_bytes", None)
    floor = getattr(e.error, "lower_bound_bytes", None)
    hint = ""
    if least is None and floor is not None:
        least, hint = (
            floor,
            f"; the least schedule peaks at no less than {floor} B in the solver's model",
        )
    elif least is not None:
        hint = f"; the least schedule peaks at {least} B in the solver's model"
        if tries:
            more = max(t.measured - t.predicted for t in tries)
            hint += f", about {least + more} B measured ({human_bytes(least + more)})"
    return CompileError(
        f"budget {budget} ({target} B) is below the least remat's partition reaches "
        f"compiled{hint}: raise the budget, use 'min', or compile without remat (torch's "
        "partition can measure lower where inductor's layout or fusion choices differ from "
        "remat's model)"
    )


def _runs_once(
    budget: object, target: int | None, tries: list[Try], e: _RunsTwice, max_compiles: int
) -> CompileError:
    """The error where the schedules within the budget recompute an op that must run once and
    the least-peak schedule, which runs it once, measured over the budget (the last try) or was
    not compiled (``max_compiles`` spent before it)."""
    what = (
        f"budget {budget} ({target} B): the solver's schedules within it recompute {e.op}, "
        "which draws random numbers or mutates and must run once"
    )
    if not tries or tries[-1].solver_budget is not None:
        return CompileError(
            f"{what}; the least-peak schedule, which runs it once, was not compiled within "
            f"max_compiles={max_compiles}: raise max_compiles or the budget, or use 'min'"
        )
    least = tries[-1].measured
    return CompileError(
        f"{what}; the least peak that runs it once measured {least} B ({human_bytes(least)}, "
        "'min'): raise the budget to it, use 'min', or compile without remat"
    )
