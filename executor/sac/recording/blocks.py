"""Which modules of a model are a SAC plan's blocks (candidate checkpoint regions)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from torch import nn

from executor.errors import PlanError

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def default_blocks(model: nn.Module) -> list[str]:
    """The model's repeated blocks, by the first rule that finds some:

    1. HF `GradientCheckpointingLayer`s (the outermost);
    2. the children of every outermost container (`ModuleList`, `Sequential`, `ModuleDict`)
       whose two or more children are all of one class with parameters, where those children
       hold at least a third of the model's parameters: a transformer's layers, a ResNet's or a
       Swin's stages' blocks, a RegNet's stages, a DenseNet's dense layers;
    3. the children with parameters of the model's largest container (the outermost on a
       tie): a MobileNet's `features`, less its activations and pools.
    """
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        GradientCheckpointingLayer = ()
    layers = [n for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    if layers:
        return _outermost(layers)
    repeated = _repeated_blocks(model)
    if repeated:
        return repeated
    best: tuple[int, str] | None = None
    for name, m in model.named_modules():
        if isinstance(m, _CONTAINERS) and len(m) >= 2 and (best is None or len(m) > best[0]):
            best = (len(m), name)
    if best is None:
        raise PlanError(
            f"{type(model).__name__} has no repeated blocks (GradientCheckpointingLayer, "
            "ModuleList, Sequential or ModuleDict children): pass blocks=[module names or glob "
            "patterns]"
        )
    modules = dict(model.named_modules())
    return [n for n in _children_of(model, best[1]) if _has_parameters(modules[n])]


def _repeated_blocks(model: nn.Module) -> list[str]:
    """Rule 2 of `default_blocks` ([] where it finds nothing)."""
    containers = []
    for name, m in model.named_modules():
        one_kind = len({type(c) for c in m.children()}) == 1
        if isinstance(m, _CONTAINERS) and len(m) >= 2 and one_kind and _has_parameters(m):
            containers.append(name)
    names = [n for c in _outermost(containers) for n in _children_of(model, c)]
    modules = dict(model.named_modules())
    covered = {id(p): p.numel() for n in names for p in modules[n].parameters()}
    total = sum(p.numel() for p in model.parameters())
    return names if len(names) >= 2 and 3 * sum(covered.values()) >= total else []


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _children_of(model: nn.Module, name: str) -> list[str]:
    prefix = f"{name}." if name else ""
    return [f"{prefix}{n}" for n, _ in model.get_submodule(name).named_children()]


def select_blocks(model: nn.Module, blocks: Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    """(name, module) of each block: `default_blocks`, or the modules whose names match the
    given names / glob patterns (the outermost of nested matches). PlanError naming a pattern
    that matches nothing."""
    modules = dict(model.named_modules())
    if blocks is None:
        names = default_blocks(model)
    else:
        if isinstance(blocks, str):
            raise PlanError(f"blocks must be a list of names or patterns, not {blocks!r}")
        names = []
        for pattern in blocks:
            found = [n for n in modules if n and fnmatch.fnmatchcase(n, pattern)]
            if not found:
                raise PlanError(
                    f"no module of {type(model).__name__} matches block {pattern!r}; its "
                    f"top-level modules are {[n for n, _ in model.named_children()]}"
                )
            names += [n for n in found if n not in names]
        names = _outermost(names)
    return [(n, modules[n]) for n in names]


def _outermost(names: list[str]) -> list[str]:
    """The names not inside another of them ("" is the root, which holds every other)."""
    if "" in names:
        return [""]
    return [n for n in names if not any(n.startswith(f"{o}.") for o in names if o != n)]
