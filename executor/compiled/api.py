"""`executor.compile`: torch.compile with remat's schedule as the partition, its byte budget
measured under the compiling backend.

The budget holds by a bounded loop: solve at a solver budget, compile, measure the compiled
step's peak on the example inputs, and where it exceeds the budget lower the solver budget by
the excess and try again, at most ``max_compiles`` times (`CompileReport.compiles` counts them,
the plain compile of a percentage's basis included).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from executor.compiled.partitioner import RegionPlan, RematPartitioner, _Infeasible, backend
from executor.compiled.step import compiled_call, measure_step
from executor.errors import CompileError
from executor.loss import default_loss
from solver.core.budget import human_bytes, parse_bytes

__all__ = ["CompileReport", "CompiledModel", "compile"]


@dataclass
class Try:
    """One compile of the loop: the solver's budget (bytes; None for "min"), the schedule's
    predicted peak (bytes, the solver's model) and the compiled step's measured peak."""

    solver_budget: int | None
    predicted: int
    measured: int


@dataclass
class CompileReport:
    """What `executor.compile` did. ``budget``: the byte budget (None for "min");
    ``peak``: the returned step's measured peak (bytes); ``plain_peak``: the compiled step's
    measured peak without a plan, where a percentage needed it (else None); ``compiles``: every
    compile the call made; ``tries``: the loop's compiles in order; ``regions``: the returned
    model's plan per compiled region (saved set, recomputes, schedule)."""

    budget: int | None
    peak: int
    plain_peak: int | None
    compiles: int
    tries: list[Try] = field(default_factory=list)
    regions: list[RegionPlan] = field(default_factory=list)


class CompiledModel(nn.Module):
    """``model`` compiled whole with remat's partition; shares ``model``'s parameters. Call
    it as the model; ``remat`` is the `CompileReport`."""

    def __init__(self, model: nn.Module, call: Callable[..., Any], report: CompileReport):
        super().__init__()
        self.model = model
        self._call = call
        self.remat = report

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)


def _options(kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(backend name, inductor options) from torch.compile's keyword arguments."""
    kwargs = dict(kwargs)
    name = kwargs.pop("backend", "inductor")
    mode = kwargs.pop("mode", None)
    options = dict(kwargs.pop("options", None) or {})
    if kwargs.pop("dynamic", False):
        raise CompileError("dynamic=True: remat budgets static shapes; drop dynamic=")
    kwargs.pop("fullgraph", None)  # always whole: a break is refused, naming it
    if kwargs:
        raise CompileError(f"torch.compile arguments {sorted(kwargs)} are not supported here")
    if mode is not None:
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode), **options}
    if not isinstance(name, str):
        raise CompileError("backend must be 'inductor' or 'aot_eager' (a name)")
    return name, options


def compile(
    model: nn.Module,
    budget: str | int | float,
    *,
    example_inputs: Sequence[object],
    example_kwargs: Mapping[str, object] | None = None,
    time_limit: float = 60,
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
    max_compiles: int = 4,
    **torch_compile_kwargs: Any,
) -> CompiledModel:
    """``model`` compiled by torch.compile (default backend inductor; ``torch_compile_kwargs``:
    ``backend`` "inductor" or "aot_eager", ``mode``, ``options``) with remat's schedule as the
    partition: the forward saves what the schedule keeps, the backward recomputes what it
    drops, where and as often as it says. ``budget``: bytes, units ("512MiB"), a percentage of
    the compiled step's measured peak without a plan ("50%") or "min" (the schedule of least
    peak). The step is ``loss_fn(model(*example_inputs, **example_kwargs)).backward()``; its
    measured peak on the example inputs is within the budget, else `CompileError`.
    ``time_limit``: seconds of solving over the whole call (compiles are bounded by
    ``max_compiles``, the plain compile of a percentage's basis not counted in it)."""
    name, options = _options(torch_compile_kwargs)
    kwargs = dict(example_kwargs or {})
    inputs = tuple(example_inputs)
    compiles = 0
    plain: list[int] = []

    def hundred() -> int:
        nonlocal compiles
        if not plain:
            call = compiled_call(model, name if not options else _plain(name, options))
            compiles += 1
            plain.append(measure_step(model, call, inputs, kwargs, loss_fn))
        return plain[0]

    minimum = isinstance(budget, str) and budget.strip().lower() == "min"
    try:
        target = None if minimum else parse_bytes(budget, hundred)
    except ValueError as e:
        raise CompileError(str(e)) from e
    deadline = time.monotonic() + time_limit
    tries: list[Try] = []
    solver_budget: int | str = "min" if minimum else target
    for attempt in range(max_compiles):
        left = max(1.0, (deadline - time.monotonic()) / (max_compiles - attempt))
        partitioner = RematPartitioner(solver_budget, left, replay_rng=name == "aot_eager")
        call = compiled_call(model, backend(name, partitioner, options))
        compiles += 1
        try:
            peak = measure_step(model, call, inputs, kwargs, loss_fn)
        except _Infeasible as e:
            raise _below_least(budget, target, tries, e) from e.error
        predicted = sum(r.schedule.peak for r in partitioner.regions)
        tries.append(Try(None if minimum else int(solver_budget), predicted, peak))
        if minimum or peak <= target:
            report = CompileReport(
                None if minimum else target,
                peak,
                plain[0] if plain else None,
                compiles,
                tries,
                partitioner.regions,
            )
            return CompiledModel(model, call, report)
        solver_budget = int(solver_budget) - (peak - target)
        if solver_budget <= 0:
            break
    raise CompileError(
        f"budget {budget} ({target} B): after {len(tries)} compiles the compiled step still "
        f"measured {tries[-1].measured} B ({human_bytes(tries[-1].measured)}); raise the "
        f"budget or max_compiles"
    )


def _plain(name: str, options: dict[str, Any]) -> Callable:
    """The backend ``name`` with inductor ``options`` and torch's own partition."""
    from torch._inductor.compile_fx import compile_fx

    if name != "inductor":
        raise CompileError(f"backend {name!r} takes no options")
    return functools.partial(compile_fx, config_patches=options)


def _below_least(budget: object, target: int | None, tries: list[Try], e: _Infeasible):
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
        f"budget {budget} ({target} B) is below the least this compiled step reaches{hint}: "
        "raise the budget or use 'min'"
    )
