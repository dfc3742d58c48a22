"""What recording a training step needs: the step, the tensors in a value, and a snapshot of
the state a run changes (RNG, buffers), so that recording leaves no trace."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.utils._pytree as pytree
from torch.utils.hooks import RemovableHandle

from graph_capture.peak import Snapshot

__all__ = ["Snapshot", "Step", "hooked", "leaf_tensors"]

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
