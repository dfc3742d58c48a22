"""What `executor.compile` holds its model against before handing it over (`executor.check`).

One training step of the compiled model on the example inputs is held against a reference
step from the same state (`executor.check.check_step`): the loss, every parameter's ``.grad``
and every buffer after the step. The reference is the step as torch would run it without
remat:

- ``aot_eager`` (the graphs run as they are, random draws replayed): eager itself, and every
  value must be `torch.equal` to it (bit for bit).
- ``inductor``: torch's own partition of the same model, compiled with the same inductor
  options. Inductor fuses and reorders reductions differently for another partition, so a
  value passes where its largest difference is at most ``rtol`` times the reference value's
  largest magnitude (`CompileCheck`), or, where the value is of rounding noise's size (at most
  ``small`` times the largest of its kind), at most ``factor`` times torch's own partition's
  distance from eager on it (one eager step: `executor.check.Noise`).

A value that fails is a `CompileError` naming it: the model is never returned. The check costs
one more step of the compiled model and one reference step (under inductor a compile of
torch's partition: about as long as one of remat's compiles, and one eager step);
`CheckReport.seconds` says what it took.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from executor.check import CheckReport, Failure, NamedValues, Noise, check_step
from executor.compiled.step import fresh_call, run_step
from executor.errors import CompileError

__all__ = ["CompileCheck", "LossStep", "check_compiled"]


@dataclass(frozen=True)
class CompileCheck:
    """How `executor.compile` checks its result. ``rtol``: under inductor, the largest
    difference allowed in a value, relative to the reference value's largest magnitude
    (aot_eager is always checked bit for bit). ``small`` and ``factor``: a value at most
    ``small`` times the largest of its kind (gradients, buffers) in the reference step may
    differ by up to ``factor`` times the reference's own distance from eager on it
    (`executor.check.Noise`: a gradient that cancels to rounding noise in every partition,
    EfficientNet's projection BatchNorm biases: 5e-6 where its largest gradient is 317, is not
    held to its own noise); every other value is held to ``rtol``."""

    rtol: float = 1e-3
    small: float = 1e-3
    factor: float = 10.0


@dataclass(frozen=True)
class LossStep:
    """The step `check_compiled` runs through each call: ``call(*inputs, **kwargs)``, then
    ``loss_fn`` of its output, then the backward."""

    inputs: Sequence[object]
    kwargs: Mapping[str, object]
    loss_fn: Callable[[object], torch.Tensor]

    def through(self, call: Callable[..., object]) -> Callable[[], NamedValues]:
        """One step through ``call`` returning its loss as "the loss"."""
        return lambda: [("the loss", run_step(call, self.inputs, self.kwargs, self.loss_fn))]


def check_compiled(
    model: nn.Module,
    call: Callable[..., object],
    reference: Callable[..., object],
    loss_step: LossStep,
    exact: bool,
    options: CompileCheck,
    reference_name: str,
    random_ops: bool,
) -> CheckReport:
    """Hold one step through ``call`` (remat's compiled model) against one through
    ``reference`` from the same state (module docstring); ``exact``: bit for bit, else within
    ``options.rtol``. ``random_ops``: the graph draws random numbers (named in the error,
    since inductor's partitions can draw them in another order). Raises `CompileError` naming
    the first value that differs."""
    hint = (
        "the graph draws random numbers, which inductor may draw in another order for "
        "another partition: check with backend='aot_eager'; "
        if random_ops and not exact
        else ""
    )
    return check_step(
        model,
        loss_step.through(call),
        loss_step.through(reference),
        Failure(
            subject="remat's compiled step",
            reference_name=reference_name,
            error=CompileError,
            advice=f"{hint}report it with the model, and compile without remat meanwhile",
        ),
        rtol=None if exact else options.rtol,
        noise=Noise(
            loss_step.through(fresh_call(model)),
            "eager",
            options.small,
            options.factor,
        ),
    )
