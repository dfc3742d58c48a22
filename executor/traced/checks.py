"""What a training step must match of its capture: the inputs, and the autocast state.

A captured graph is specialised to its example: input count, keyword names, shapes, dtypes,
requires_grad and device, the branches an HF model's mask code took from the example's values
(``CapturedGraph.mask_guards``: is a token padded, are sequences packed), and the casts of the
autocast state it was traced under. A step that differs would replay another computation than
eager's, so it is refused with a message saying what differs and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from executor.errors import AutocastMismatchError, InputMismatchError
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.device import AutocastState

__all__ = ["check_autocast", "check_call", "check_inputs"]


def check_call(
    captured: CapturedGraph,
    device: torch.device,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
) -> None:
    """`check_inputs`, then `check_autocast`."""
    check_inputs(captured, device, inputs, kwargs)
    check_autocast(captured)


def check_autocast(captured: CapturedGraph) -> None:
    """Raise AutocastMismatchError unless the autocast state in force now is the one the
    graph was captured under (the graph holds that state's casts)."""
    state = captured.autocast
    now = AutocastState.current(torch.device(state.device_type))
    if now != state:
        raise AutocastMismatchError(
            f"this step runs under {now.describe()}, but the graph was captured under "
            f"{state.describe()}, whose casts it holds; capture (rematerialize) under "
            "the same autocast as the training step"
        )


def check_inputs(
    captured: CapturedGraph,
    device: torch.device,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
) -> None:
    """Raise InputMismatchError saying what differs from the captured example inputs
    (``device``: the model's), or naming the inputs on whose values eager HF would take
    another mask branch than the graph holds (`graph_capture.trace.hf_masks.MaskGuard`: one
    pass over each such input, e.g. an ``all()`` of the attention mask)."""
    names = captured.kwarg_names
    specs = captured.input_specs
    if len(inputs) != len(specs) - len(names):
        raise InputMismatchError(
            f"expected {len(specs) - len(names)} positional tensor inputs (as captured), "
            f"got {len(inputs)}"
        )
    if set(kwargs) != set(names):
        raise InputMismatchError(
            f"expected keyword inputs {sorted(names)} (as captured), got {sorted(kwargs)}; "
            "capture with the keyword arguments the training step passes"
        )
    labelled = [(f"input {i}", x) for i, x in enumerate(inputs)]
    labelled += [(f"keyword input '{k}'", kwargs[k]) for k in names]
    for (what, x), spec in zip(labelled, specs, strict=True):
        if not isinstance(x, torch.Tensor):
            raise InputMismatchError(f"{what}: expected a tensor, got {type(x).__name__}")
        if tuple(x.shape) != spec.shape or x.dtype != spec.dtype:
            batch = (
                x.dtype == spec.dtype
                and x.dim() == len(spec.shape) > 0
                and tuple(x.shape[1:]) == spec.shape[1:]
            )
            raise InputMismatchError(
                f"{what}: captured with shape {spec.shape} and dtype {spec.dtype}, got "
                f"shape {tuple(x.shape)} and dtype {x.dtype}; the graph is specialised to "
                "the example shapes: capture (and solve) again for these inputs"
                + (", or, for a smaller last batch, DataLoader(drop_last=True)" if batch else "")
            )
        if x.requires_grad and not spec.requires_grad:
            raise InputMismatchError(
                f"{what} requires grad, but the graph was captured with an example that "
                "does not, so it computes no gradient for it; capture with an example "
                "that has requires_grad_()"
            )
        if x.device != device:
            raise InputMismatchError(
                f"{what}: on {x.device}, but the model is on {device}; move it there"
            )
    for guard in captured.mask_guards:
        if why := guard.mismatch(inputs, kwargs):
            raise InputMismatchError(why)
