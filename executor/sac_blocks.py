"""Which modules of a model are a SAC plan's blocks (candidate checkpoint regions)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from torch import nn


def default_blocks(model: nn.Module) -> list[str]:
    """The model's repeated blocks: HF `GradientCheckpointingLayer`s if it has any, else the
    children of its largest `ModuleList` / `Sequential` (the outermost on a tie)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        GradientCheckpointingLayer = ()
    layers = [n for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    if layers:
        return _outermost(layers)
    best: tuple[int, str] | None = None
    for name, m in model.named_modules():
        repeated = isinstance(m, nn.ModuleList | nn.Sequential) and len(m) >= 2
        if repeated and (best is None or len(m) > best[0]):
            best = (len(m), name)
    if best is None:
        raise ValueError(
            f"{type(model).__name__} has no repeated blocks (GradientCheckpointingLayer, "
            "ModuleList or Sequential children): pass blocks=[module names or glob patterns]"
        )
    prefix = f"{best[1]}." if best[1] else ""
    return [f"{prefix}{n}" for n, _ in dict(model.named_modules())[best[1]].named_children()]


def select_blocks(model: nn.Module, blocks: Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    """(name, module) of each block: `default_blocks`, or the modules whose names match the
    given names / glob patterns (the outermost of nested matches). ValueError naming a pattern
    that matches nothing."""
    modules = dict(model.named_modules())
    if blocks is None:
        names = default_blocks(model)
    else:
        if isinstance(blocks, str):
            raise ValueError(f"blocks must be a list of names or patterns, not {blocks!r}")
        names = []
        for pattern in blocks:
            found = [n for n in modules if n and fnmatch.fnmatchcase(n, pattern)]
            if not found:
                raise ValueError(
                    f"no module of {type(model).__name__} matches block {pattern!r}; its "
                    f"top-level modules are {[n for n, _ in model.named_children()]}"
                )
            names += [n for n in found if n not in names]
        names = _outermost(names)
    return [(n, modules[n]) for n in names]


def _outermost(names: list[str]) -> list[str]:
    """The names not inside another of them."""
    return [n for n in names if not any(n.startswith(f"{o}.") for o in names if o != n)]
