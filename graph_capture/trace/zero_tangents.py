"""Outputs the training step does not backpropagate from: their incoming gradients are zero.

Autograd hands a zero gradient to every differentiable output of a step that the loss does not
use (an HF model's ``logits`` when only ``.loss`` is backpropagated, its key/value cache).
The joint graph still has a tangent placeholder for each; AOTAutograd adds it to the gradient
that flows into the same value from the loss, ``add(tangent, grad)``. Eager autograd computes
neither the zeros nor that add. When capture is told which outputs the loss uses
(``backward_from``), the other tangents are **known zero** and the graph is specialised:

- an ``add`` of a known-zero tangent and a value of the add's own shape, dtype and strides, not
  a graph output, is folded away (its readers read the value itself): eager's exact bits (a sum
  with +0.0 would turn a -0.0 into +0.0), no full-size sum allocated, no time spent; where the
  value has other strides and the add's result is contiguous, the add becomes a contiguous copy
  of the value (the same bits and strides as eager's gradient, without the tangent);
- a known-zero tangent nothing reads any more is bound to `zero_tangent`, a one-element zero
  expanded to the output's shape (stride 0: one element of memory);
- a known-zero tangent still read by other ops (an output off the loss path, whose backward
  then runs on zeros as it did before) is bound to full zeros, as autograd materialises them.

Output names (``backward_from``) are the top-level keys of the model's output: a field of a
``ModelOutput`` or a dict key (``"loss"``), the index of a tuple or list item, or a namedtuple
field; every tensor under a name is selected.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
import torch.fx

from graph_capture.errors import CaptureError
from graph_capture.tensor_spec import TensorSpec

__all__ = [
    "default_tangents",
    "fold_zero_tangent_adds",
    "missing_gradient",
    "output_leaves",
    "selected_outputs",
    "zero_tangent",
]

OutputName = str | int


def output_leaves(treespec: object) -> dict[OutputName, range]:
    """Top-level name of the model's output -> the flat forward output positions under it.

    A bare tensor output is name 0. ``treespec``: the pytree spec of the output
    (``CapturedGraph.output_treespec``)."""
    if treespec.is_leaf():
        return {0: range(0, 1)}
    context = treespec.context
    if isinstance(context, list | tuple):
        names: list[OutputName] = list(context)
    elif isinstance(context, type) and hasattr(context, "_fields"):
        names = list(context._fields)
    else:
        names = list(range(treespec.num_children))
    leaves: dict[OutputName, range] = {}
    start = 0
    for name, child in zip(names, treespec.children(), strict=True):
        leaves[name] = range(start, start + child.num_leaves)
        start += child.num_leaves
    return leaves


def selected_outputs(treespec: object, names: Sequence[OutputName]) -> set[int]:
    """Flat forward output positions under the top-level output ``names``.

    Raises `CaptureError` naming the model's outputs when a name is not one of them."""
    leaves = output_leaves(treespec)
    unknown = [n for n in names if n not in leaves]
    if unknown:
        raise CaptureError(
            f"backward_from names {unknown}, not outputs of the model; its outputs are "
            f"{list(leaves)}"
        )
    return {position for n in names for position in leaves[n]}


def zero_tangent(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero of ``shape`` holding one element: a scalar zero expanded (stride 0)."""
    return torch.zeros((), dtype=dtype, device=device).expand(tuple(shape))


def missing_gradient(gm: torch.fx.GraphModule, placeholder: str, spec: TensorSpec) -> torch.Tensor:
    """The tangent bound to ``placeholder`` of `gm` when its output gets no gradient:
    `zero_tangent` when nothing reads it, else zeros of the output's shape (what autograd
    materialises)."""
    (node,) = (n for n in gm.graph.find_nodes(op="placeholder") if n.name == placeholder)
    if node.users:
        return torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)
    return zero_tangent(spec.shape, spec.dtype, spec.device)


def default_tangents(
    gm: torch.fx.GraphModule,
    placeholders: Sequence[str],
    output_indices: Sequence[int],
    output_specs: Sequence[TensorSpec],
    zero_outputs: Collection[int],
) -> list[torch.Tensor]:
    """One tangent per placeholder (the gradient of forward output ``output_indices[i]``):
    ones (``sum()`` of the output as the loss), or `missing_gradient` for a known-zero one."""
    tangents = []
    for name, k in zip(placeholders, output_indices, strict=True):
        spec = output_specs[k]
        if k in zero_outputs:
            tangents.append(missing_gradient(gm, name, spec))
        else:
            tangents.append(torch.ones(spec.shape, dtype=spec.dtype, device=spec.device))
    return tangents


def _layouts(add: torch.fx.Node, value: torch.fx.Node) -> tuple[bool, bool]:
    """(the add's result has ``value``'s shape, dtype and strides and ``value`` starts its
    storage; the add's result has ``value``'s shape and dtype and is contiguous), from the
    traced metadata."""
    va, vb = add.meta.get("val"), value.meta.get("val")
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
        return False, False
    if va.shape != vb.shape or va.dtype != vb.dtype:
        return False, False
    same = va.stride() == vb.stride() and vb.storage_offset() == 0
    return same, va.is_contiguous()


def fold_zero_tangent_adds(gm: torch.fx.GraphModule, zero_placeholders: Sequence[str]) -> int:
    """Fold every ``aten.add.Tensor(t, x)`` / ``(x, t)`` with ``t`` a known-zero tangent
    placeholder and a result that is no graph output: into ``x`` itself when the result has
    x's layout (module docstring), else into a contiguous copy of ``x`` when the result is
    contiguous (the same values and strides as the add's, and no tangent to hold); returns how
    many adds were folded. ``gm`` is recompiled when something was."""
    add, clone = torch.ops.aten.add.Tensor, torch.ops.aten.clone.default
    zeros = {n for n in gm.graph.find_nodes(op="placeholder") if n.name in zero_placeholders}
    folded = 0
    for tangent in zeros:
        for user in list(tangent.users):
            if user.target is not add or len(user.args) != 2 or user.kwargs.get("alpha", 1) != 1:
                continue
            other = user.args[1] if user.args[0] is tangent else user.args[0]
            if not isinstance(other, torch.fx.Node) or other in zeros:
                continue
            if any(u.op == "output" for u in user.users):
                continue
            same, contiguous = _layouts(user, other)
            if same:
                user.replace_all_uses_with(other)
            elif contiguous:
                with gm.graph.inserting_before(user):
                    copy = gm.graph.call_function(
                        clone, (other,), {"memory_format": torch.contiguous_format}
                    )
                copy.meta = dict(user.meta)
                user.replace_all_uses_with(copy)
            else:
                continue
            gm.graph.erase_node(user)
            folded += 1
    if folded:
        gm.recompile()
    return folded
