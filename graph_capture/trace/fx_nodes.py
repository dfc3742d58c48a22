"""Where a joint-graph fx node came from (its phase, its nn.Module) and where it runs."""

from __future__ import annotations

import re

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["describe_op", "device_of", "module_of", "phase_of"]

_REPEAT_SUFFIX = re.compile(r"@\d+$")


def phase_of(node: torch.fx.Node) -> str:
    """ "backward" for ops AOTAutograd traced from the backward pass, else "forward"."""
    return "backward" if node.meta.get("partitioner_tag") == "is_backward" else "forward"


def module_of(node: torch.fx.Node) -> str:
    """Dotted path of the innermost nn.Module the op came from ("" for the root module).

    Backward ops report the module of the forward op they differentiate.
    """
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return ""
    path = next(reversed(stack.values()))[0]
    parts = [_REPEAT_SUFFIX.sub("", part) for part in path.split(".")]
    return ".".join(p for p in parts if p and not p.startswith("L["))


def describe_op(node: torch.fx.Node) -> str:
    """ "op aten.mm.default (fx node 'mm_3') in module 'blocks.0.attn'", for error messages."""
    return f"op {node.target} (fx node '{node.name}') in module '{module_of(node) or '(root)'}'"


def device_of(node: torch.fx.Node) -> torch.device:
    """The device of the node's first traced tensor output (CPU when it has none): where the
    op runs, and whose generator a random op draws from."""
    for value in tree_leaves(node.meta.get("val")):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")
