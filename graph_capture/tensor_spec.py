"""`TensorSpec`: what a capture records of one example input or traced output."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype, requires_grad and device of one example input or traced output."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), tensor.dtype, tensor.requires_grad, tensor.device)
