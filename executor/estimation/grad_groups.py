"""Which gradients are complete when: the trainable parameters grouped as the step's backward
completes them (`GradGroups`), the groups `solver.target.components` counts as gradients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from executor.sac.step import in_call_order


@dataclass(frozen=True)
class GradGroups:
    """The trainable parameters (each once): per block in forward order, its own; `head`: the
    root's whose module a forward first calls after the last block (their gradients complete
    before the blocks' backward); `stem`: the root's others (complete at the step's end)."""

    blocks: tuple[tuple[nn.Parameter, ...], ...]
    head: tuple[nn.Parameter, ...]
    stem: tuple[nn.Parameter, ...]

    def block_bytes(self, rounding: int = 1) -> list[int]:
        """Bytes of each block's gradients, then the root's (head and stem), each storage
        rounded up to `rounding` bytes (the device's allocator)."""
        blocks = [_nbytes(ps, rounding) for ps in self.blocks]
        return [*blocks, _nbytes(self.head, rounding) + _nbytes(self.stem, rounding)]

    def head_bytes(self, rounding: int = 1) -> int:
        """Bytes of the head's gradients, rounded as `block_bytes`."""
        return _nbytes(self.head, rounding)


def _nbytes(params: Sequence[nn.Parameter], rounding: int) -> int:
    return sum(-(-p.numel() * p.element_size() // rounding) * rounding for p in params)


def grad_groups(
    model: nn.Module,
    blocks: Sequence[tuple[str, nn.Module]],
    forward: Callable[[], torch.Tensor],
) -> GradGroups:
    """The groups of `model`'s trainable parameters for `blocks` ((name, module) in forward
    order); `forward()` runs one forward (without grad here) to find the head's modules."""
    seen: set[int] = set()
    per_block = []
    for _, block in blocks:
        params = [p for p in block.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        per_block.append(tuple(params))
    owners = [
        (name, m)
        for name, m in model.named_modules()
        if any(id(p) not in seen for p in m.parameters(recurse=False))
    ]
    last = blocks[-1]
    order = [name for name, _ in in_call_order(model, [last, *owners], forward)]
    at = order.index(last[0]) if last[0] in order else len(order)
    modules = dict(owners)

    def used(names: Sequence[str]) -> set[int]:
        return {id(p) for name in names for p in modules[name].parameters(recurse=False)}

    # a tied parameter (an embedding the head reuses) is first used before the blocks
    head_ids = used(order[at + 1 :]) - used(order[:at])
    rest = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad and id(p) not in seen]
    head = tuple(p for p in rest if id(p) in head_ids)
    stem = tuple(p for p in rest if id(p) not in head_ids)
    return GradGroups(tuple(per_block), head, stem)
