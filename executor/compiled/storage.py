"""Which fx nodes of an emitted graph share a storage: view chains and their roots.

NOTE [one saved tensor per storage]: AOTAutograd donates to the backward every saved tensor
that aliases no graph input or output (``torch._functorch.config.donated_buffer``), and inductor
reuses a donated buffer once that tensor's own last reader has run. Two saved tensors of one
storage (a view and its base, two views of one split) would let a kernel overwrite the storage
that the other still views: silently wrong gradients. The forward therefore saves one tensor per
storage, the root of its view chain (`view_root`, `one_per_storage`), and the backward takes its
views again from it (view ops allocate nothing).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

import torch

__all__ = ["base_in", "one_per_storage", "view_root"]

_ALIASING = {torch.ops.aten._unsafe_view.default}
"""Ops whose output shares its input's storage though their schema declares no alias."""


def _view_base(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node whose storage ``node``'s output views: the input of a view op (or of an op in
    `_ALIASING`), or for a ``getitem`` of a view op's list (``split``) that op's input; None
    where ``node`` creates its own storage."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    target, base = node.target, node.args[0]
    if target is operator.getitem:
        source = base.target
        if isinstance(source, torch._ops.OpOverload) and source.is_view:
            return base.args[0] if isinstance(base.args[0], torch.fx.Node) else None
        return None
    if isinstance(target, torch._ops.OpOverload) and (target.is_view or target in _ALIASING):
        return base
    return None


def view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The first node of ``node``'s view chain: the one that created the storage it views."""
    while (base := _view_base(node)) is not None:
        node = base
    return node


def base_in(node: torch.fx.Node, names: Sequence[str]) -> bool:
    """Whether ``node`` views the storage of another of ``names`` (its DAG node's members)."""
    base = _view_base(node)
    return base is not None and base.name in names


def one_per_storage(
    saved: dict[torch.fx.Node, str], origin: Mapping[torch.fx.Node, str]
) -> dict[torch.fx.Node, str]:
    """``saved`` (forward copy -> joint name) with every group of copies that share a view
    root replaced by that root (NOTE [one saved tensor per storage]); ``origin`` names each
    copy's joint node. A copy alone on its storage stays as it is."""
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for copy in saved:
        groups.setdefault(view_root(copy), []).append(copy)
    kept: dict[torch.fx.Node, str] = {}
    for root, copies in groups.items():
        if len(copies) == 1:
            kept[copies[0]] = saved[copies[0]]
        else:
            kept[root] = saved.get(root, origin[root])
    return kept
