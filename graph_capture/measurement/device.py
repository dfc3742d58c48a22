"""The device a model trains on, and its random generator, clock and autocast state.

Capture and the executor follow the model's device (its first parameter's): tangents and
measurements are made there, random ops replay that device's generator, and the autocast state
that matters is the one for that device type. CPU and CUDA are handled; on CPU the CUDA
branches are never taken (and were not run on the machines this was written on).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "AutocastState",
    "fork_rng",
    "generator",
    "model_device",
    "no_autocast",
    "synchronize",
]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a model with neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def generator(device: torch.device) -> torch.Generator:
    """The default generator random ops on ``device`` draw from."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def fork_rng(device: torch.device) -> contextlib.AbstractContextManager:
    """Restore the CPU generator, and ``device``'s when it is a CUDA device, on exit."""
    cuda = [device] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=cuda, device_type="cuda")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on CPU), so a clock reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class AutocastState:
    """Whether autocast is on for one device type, and its dtype (``None`` when off).

    A captured graph holds the casts autocast made while it was traced, so it replays eager
    only under the same state: `current` reads it, ``==`` compares.
    """

    device_type: str
    enabled: bool
    dtype: torch.dtype | None

    @classmethod
    def current(cls, device: torch.device) -> AutocastState:
        """The autocast state in force now for ``device``'s type."""
        kind = device.type
        if not torch.is_autocast_enabled(kind):
            return cls(kind, False, None)
        return cls(kind, True, torch.get_autocast_dtype(kind))

    def describe(self) -> str:
        """``torch.autocast("cpu", dtype=torch.bfloat16)`` or ``no autocast on cpu``."""
        if not self.enabled:
            return f"no autocast on {self.device_type}"
        return f'torch.autocast("{self.device_type}", dtype={self.dtype})'


@contextlib.contextmanager
def no_autocast(device_type: str) -> Iterator[None]:
    """Autocast off for ``device_type`` ("cpu", "cuda"): a captured graph already holds
    autocast's casts, and applying autocast to its ops a second time could change them."""
    with torch.autocast(device_type, enabled=False):
        yield
