"""Tensors rebuilt on a storage: how an offloaded value comes back on the storage its bytes were
reloaded into (the traced executor's `executor.traced.offload`, SAC's
`executor.sac.runtime.offload.SavedOnHost`).

A storage is copied whole, byte for byte; each tensor that used it is rebuilt on the copy with
its own dtype, storage offset, size and stride (`View`), so views, aliases and non-contiguous
tensors come back bit-identical, sharing the copy as they shared the original.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["View", "storage_bytes"]


class View(NamedTuple):
    """Where a tensor lies in its storage: its `dtype`, `offset` (elements of `dtype` from the
    storage's start), `size` and `stride` (elements)."""

    dtype: torch.dtype
    offset: int
    size: torch.Size
    stride: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> View:
        """`tensor`'s place in its storage."""
        return cls(tensor.dtype, tensor.storage_offset(), tensor.size(), tensor.stride())

    def on(self, storage: torch.UntypedStorage) -> torch.Tensor:
        """The tensor at this place in `storage` (on `storage`'s device, sharing its bytes)."""
        tensor = torch.empty(0, dtype=self.dtype, device=storage.device)
        return tensor.set_(storage, self.offset, self.size, self.stride)


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole of `storage` (its `nbytes()` bytes, sharing them)."""
    return View(torch.uint8, 0, torch.Size((storage.nbytes(),)), (1,)).on(storage)
