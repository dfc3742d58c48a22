"""The step's loss where a runtime runs the step itself (`checkpoint_plan`, `fit`): one
convention for both, `loss_fn(output) -> scalar tensor`, default `default_loss`."""

from __future__ import annotations

import torch

from executor.errors import PlanError

__all__ = ["default_loss"]


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
