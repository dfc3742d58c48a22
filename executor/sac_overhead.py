"""The SAC runtime's own price per region (`measure_overhead`): seconds a training step pays
for running a region under a SAC policy rather than under plain checkpoint."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.sac_policy import Policy
from executor.sac_step import Snapshot, Step, leaf_tensors


def _region_inputs(model: nn.Module, regions: Sequence[nn.Module], step: Step) -> list:
    """Per region, the (args, kwargs) it is called with in one forward of the step: tensors
    detached and cloned, each with its `requires_grad`."""
    calls: list = [None] * len(regions)

    def keep(j: int, args, kwargs) -> None:
        if calls[j] is None:
            calls[j] = pytree.tree_map_only(
                torch.Tensor,
                lambda t: t.detach().clone().requires_grad_(t.requires_grad),
                (args, kwargs),
            )

    handles = [
        m.register_forward_pre_hook(lambda _m, a, k, j=j: keep(j, a, k), with_kwargs=True)
        for j, m in enumerate(regions)
    ]
    snapshot = Snapshot(model)
    try:
        loss = step()
        del loss
    finally:
        for h in handles:
            h.remove()
        snapshot.restore()
    return calls


def _region_step(module: nn.Module, call, policy: Policy | None) -> float:
    """Seconds of one forward and backward of the region alone inside `checkpoint(
    use_reentrant=False)`, under `policy` (None: plain checkpoint); the backward reruns it."""
    args, kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: t.clone() if t.requires_grad else t, call
    )  # a non-leaf copy: the region may write its inputs in place
    for p in module.parameters():
        p.grad = None
    forward = type(module).forward.__get__(module)
    extra = {} if policy is None else {"context_fn": policy.contexts}
    start = time.perf_counter()
    out = checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)
    if policy is not None:
        policy.check_complete()
    outs = [t for t in leaf_tensors(out) if t.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return time.perf_counter() - start


def _paired_overhead(module: nn.Module, call, name: str, ops: Sequence[str], repeats: int) -> float:
    """Median over `repeats` pairs of the region's step under its all-recompute policy minus
    its step under plain checkpoint (seconds, at least 0), after one warm-up of each."""

    def sac() -> float:
        return _region_step(module, call, Policy(name, ops, frozenset()))

    def plain() -> float:
        return _region_step(module, call, None)

    sac(), plain()
    differences = []
    for r in range(repeats):
        if r % 2:
            with_policy, without = sac(), plain()
        else:
            without, with_policy = plain(), sac()
        differences.append(with_policy - without)
    return max(0.0, statistics.median(differences))


def measure_overhead(
    model: nn.Module,
    regions: Sequence[nn.Module],
    ops: Sequence[Sequence[str]],
    step: Step,
    repeats: int = 5,
) -> list[float | None]:
    """Per region, the seconds a training step pays for running it under a SAC policy rather
    than under plain checkpoint: the policy's dispatch modes in its forward and its recompute
    and the op-stream check (`executor.sac_policy.Policy`, recomputing every op: the same
    recompute as plain checkpoint's). Each region runs alone, forward and backward, on the
    inputs it gets in the step (`ops`: its recorded op stream, which the policy checks), under
    both, side by side: after one warm-up of each, `repeats` pairs, alternating which runs
    first; the median of the pairs' differences, at least 0. The thread count is the caller's.
    None for a region that fails inside checkpoint (autograd's RuntimeError: a module that
    writes its input in place, such as an in-place ReLU, invalidates the input checkpoint keeps).
    """
    calls = _region_inputs(model, regions, step)
    snapshot = Snapshot(model)
    grads = {p: p.grad for p in model.parameters()}
    out: list[float | None] = []
    try:
        for j, (module, call) in enumerate(zip(regions, calls, strict=True)):
            if call is None:
                raise ValueError(f"region {j} ({type(module).__name__}) is not called by the step")

            try:
                out.append(_paired_overhead(module, call, f"region {j}", ops[j], repeats))
            except RuntimeError:  # e.g. it writes its own input in place: autograd refuses
                out.append(None)
    finally:
        snapshot.restore()
        for p, g in grads.items():
            p.grad = g
    return out
