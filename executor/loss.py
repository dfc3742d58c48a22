"""The step's loss where a runtime runs the step itself (`checkpoint_plan`, `fit`,
`compile`): one convention for all, `loss_fn(output) -> scalar tensor`, default
`default_loss`, whose refusal of an output without a loss is one message in each runtime's
class (`step_loss`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from executor.errors import ExecutorError, PlanError

__all__ = ["default_loss", "step_loss"]


def default_loss(output: object) -> torch.Tensor:
    """The step's loss, the default `loss_fn` of `checkpoint_plan` and `fit`: `output.loss`
    when the output has one (HF models given labels), else the output itself when it is a
    scalar tensor (a forward that returns its loss). Any other output raises `PlanError`
    asking for `loss_fn`: no loss is made up from it."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    shape = (
        f"a tensor of shape {tuple(output.shape)}"
        if isinstance(output, torch.Tensor)
        else (type(output).__name__)
    )
    raise PlanError(
        f"the model's output is {shape}, neither a scalar loss nor an object with `.loss`: "
        "pass loss_fn=, a function from the output to the scalar loss (e.g. "
        "loss_fn=lambda out: F.cross_entropy(out, targets))"
    )


def step_loss(
    loss_fn: Callable[[object], torch.Tensor], output: object, error: type[ExecutorError]
) -> torch.Tensor:
    """``loss_fn(output)``, `default_loss`'s refusal of an output without a loss raised as
    ``error`` (the runtime's class: `FitError`, `CompileError`) with its message."""
    try:
        return loss_fn(output)
    except PlanError as e:
        if error is PlanError:
            raise
        raise error(str(e)) from e
