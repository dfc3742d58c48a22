"""What an estimate holds the same at every size and under every re-plan
(`EstimateSettings`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from solver.core.link import Link
from solver.target import Device, FsdpPolicy


@dataclass(frozen=True)
class EstimateSettings:
    """What an estimate holds the same at every size: `estimate`'s arguments of the same names
    (`link`: the host link `offload` names; `alloc_conf`: the caching allocator's settings,
    `alloc_conf`'s or the environment's)."""

    blocks: Sequence[str] | None
    regions: str
    loss_fn: Callable[[object], torch.Tensor]
    target: str | Device | None
    world_size: int
    fsdp: FsdpPolicy | None
    budget: str | int | None
    optimizer: str
    link: Link | None
    alloc_conf: str = ""
