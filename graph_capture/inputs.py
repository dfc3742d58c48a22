"""A model's example inputs as every runtime takes them: one normalisation for all."""

from __future__ import annotations

import torch

from graph_capture.errors import CaptureError


def positional_inputs(
    example_inputs: object, error: type[Exception] = CaptureError
) -> tuple[object, ...]:
    """``example_inputs`` as the tuple of a model's positional inputs: a tuple or list as it
    is, one tensor as the one input ``(x,)``; anything else refused in one line by ``error``
    (the runtime's class)."""
    if isinstance(example_inputs, tuple | list):
        return tuple(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    raise error(
        "example_inputs must be a tuple or list of the positional inputs, or one tensor, not a "
        f"{type(example_inputs).__name__}: pass (x,) or x for model(x), (x, y) for model(x, y), "
        "keyword inputs as example_kwargs"
    )
