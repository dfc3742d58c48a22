"""What `executor.compile` and `CompiledModel.load` report: `CompileReport`, with a `Try` for
each compile of the budget loop (`executor.compiled.budget_loop`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.check import CheckReport
from executor.compiled.partitioner import RegionPlan


@dataclass
class Try:
    """One compile of the loop: the solver's budget (bytes; None for "min"), the schedule's
    predicted peak (bytes, the solver's model), the compiled step's measured peak (bytes) and
    the seconds of its compile and measurement."""

    solver_budget: int | None
    predicted: int
    measured: int
    seconds: float


@dataclass
class CompileReport:
    """What `executor.compile` did. ``budget``: the byte budget (None for "min");
    ``peak``: the returned step's measured peak (bytes); ``plain_peak``: the compiled step's
    measured peak without a plan, where a percentage needed it (else None); ``compiles``: every
    compile the call made; ``tries``: the loop's compiles in order; ``regions``: the returned
    model's plan per compiled region (saved set, recomputes, dead computes, schedule);
    ``stopped``: None, or why a solve of the returned plan ended before proving its schedule
    ("time limit", "interrupted"); ``check``: the returned step held against torch's
    (`executor.compiled.check`)."""

    budget: int | None
    peak: int
    plain_peak: int | None
    compiles: int
    tries: list[Try] = field(default_factory=list)
    regions: list[RegionPlan] = field(default_factory=list)
    stopped: str | None = None
    check: CheckReport | None = None
