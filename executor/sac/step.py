"""What recording a training step needs: the step, the tensors in a value, and a snapshot of
the state a run changes (RNG, buffers), so that recording leaves no trace."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.hooks import RemovableHandle

Step = Callable[[], torch.Tensor]
"""The forward of one training step: returns the scalar loss."""


def leaf_tensors(tree: object) -> list[torch.Tensor]:
    """The tensors among the leaves of a pytree (args, kwargs, outputs)."""
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


@contextlib.contextmanager
def hooked(handles: Iterable[RemovableHandle]) -> Iterator[None]:
    """A block in which the hooks of `handles` stay registered; they are removed after it."""
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class Snapshot:
    """RNG state, buffers and parameters' `.grad` taken now, restored by `restore` (recording
    leaves no trace)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rng = torch.get_rng_state()
        self.buffers = {k: v.clone() for k, v in model.named_buffers()}
        self.grads = {p: p.grad for p in model.parameters()}

    def restore(self) -> None:
        torch.set_rng_state(self.rng)
        with torch.no_grad():
            for k, v in self.model.named_buffers():
                v.copy_(self.buffers[k])
        for p, g in self.grads.items():
            p.grad = g
