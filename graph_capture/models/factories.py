"""Models from factories: ``MODULE:FACTORY`` imported (from the current directory too, as
``python -m`` would), and a factory's result checked and unpacked into ``(model in train mode,
example_inputs, example_kwargs)``. Used by the `remat` commands and by `executor.fit`, which calls
a factory at each size it tries.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import torch
from torch import nn

from graph_capture.errors import CaptureError
from graph_capture.inputs import positional_inputs


def import_factory(spec: str) -> Callable[..., object]:
    """The callable ``MODULE:FACTORY`` names (MODULE imported from the current directory or
    the installed packages); CaptureError saying why where it cannot be loaded."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise CaptureError(f"--model wants MODULE:FACTORY, got {spec!r}")
    try:
        return getattr(_import_from_cwd(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise CaptureError(
            f"cannot load --model {spec}: {error} (MODULE is imported from the "
            "current directory or the installed packages)"
        ) from error


Made = tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]
"""A factory's result unpacked: ``(model, example_inputs, example_kwargs)``."""


def unpack_model(made: object) -> Made:
    """A factory's result as ``(model in train mode, example_inputs, example_kwargs)``, one
    tensor as the one input (`positional_inputs`); CaptureError where it is not ``(model,
    example_inputs[, example_kwargs])``."""
    if not (isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module)):
        raise CaptureError("the factory must return (model, example_inputs[, example_kwargs])")
    model, inputs, kwargs = made if len(made) == 3 else (*made, {})
    return model.train(), positional_inputs(inputs), dict(kwargs)


def _import_from_cwd(module_name: str):
    """`importlib.import_module`, with the current directory searched first as ``python -m``
    searches it (a console script's ``sys.path`` starts at its own bin directory instead)."""
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:
        return importlib.import_module(module_name)
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    finally:
        sys.path.remove(cwd)
