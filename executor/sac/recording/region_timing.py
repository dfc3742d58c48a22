"""A region run and timed alone, on the inputs it gets in the step: its forward and backward
inside `checkpoint(use_reentrant=False)` or without (`region_step`), and its checkpoint price and
SAC overhead measured side by side (`region_times`, `RegionTimes`). `Measurer.region_times`
times regions with it; `executor.sac.recording.estimate.Estimate.region_times` runs a region once
with it, fake."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import nn

from executor.sac.runtime.policy import Policy
from executor.sac.runtime.region import run_checkpointed
from executor.sac.step import leaf_tensors


def copy_tensors(tree: object, copy: Callable[[torch.Tensor], torch.Tensor]) -> object:
    """`tree` with its tensors replaced by `copy` of them as the model sees them: one tensor
    passed twice (``mha(x, x, x)``) stays one tensor, and views of one base stay views of one
    copied base (`copy` is applied to bases only), so that a module that branches on identity
    or aliasing (`nn.MultiheadAttention`'s ``query is key``) takes the path it takes in the
    step."""
    copies: dict[int, torch.Tensor] = {}

    def one(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in copies:
            base = t if t._base is None else t._base
            if id(base) not in copies:
                copies[id(base)] = copy(base)
            if base is not t:
                copied = copies[id(base)]
                copies[id(t)] = (
                    t
                    if copied is base
                    else copied.as_strided(t.size(), t.stride(), t.storage_offset())
                )
        return copies[id(t)]

    return pytree.tree_map_only(torch.Tensor, one, tree)


def region_step(
    module: nn.Module,
    call,
    policy: Policy | None,
    checkpointed: bool = True,
    now: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds of one forward and backward of the region alone inside `checkpoint(
    use_reentrant=False)`, under `policy` (None: plain checkpoint), the backward rerunning it;
    `checkpointed=False`: without checkpoint. `now`: the clock (`DeviceMeter.now`: on CUDA,
    the device synchronized before each read)."""
    # a non-leaf copy: the region may write its inputs in place
    args, kwargs = copy_tensors(call, lambda t: t.clone() if t.requires_grad else t)
    for p in module.parameters():
        p.grad = None
    start = now()
    if checkpointed:
        out = run_checkpointed(module, args, kwargs, policy)
    else:
        out = type(module).forward(module, *args, **kwargs)
    outs = [t for t in leaf_tensors(out) if t.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return now() - start


class RegionTimes(NamedTuple):
    """A region's measured prices, seconds: `overhead`, its step under its all-recompute SAC
    policy minus under plain checkpoint (at least 0); `checkpoint`, its step under plain
    checkpoint minus without checkpoint (full recompute and checkpoint's own machinery; may be
    negative within the timing's noise)."""

    overhead: float
    checkpoint: float


def region_times(
    module: nn.Module,
    call,
    name: str,
    ops: Sequence[str],
    rounds: Iterable[int],
    now: Callable[[], float] = time.perf_counter,
) -> RegionTimes:
    """The region's step without checkpoint, under plain checkpoint and under its all-recompute
    policy, one warm-up of each, then the `rounds` (0, 1, ...) of the three side by side, the
    order rotated each round; the medians of the rounds' differences, timed by `now`."""
    runs = (
        lambda: region_step(module, call, None, checkpointed=False, now=now),
        lambda: region_step(module, call, None, now=now),
        lambda: region_step(module, call, Policy(name, ops, frozenset()), now=now),
    )
    for run in runs:
        run()
    overheads, checkpoints = [], []
    for r in rounds:
        seconds = [0.0] * 3
        for k in range(3):
            which = (k + r) % 3
            seconds[which] = runs[which]()
        bare, plain, sac = seconds
        overheads.append(sac - plain)
        checkpoints.append(plain - bare)
    return RegionTimes(max(0.0, statistics.median(overheads)), statistics.median(checkpoints))
