"""Measured training steps: peak activation bytes (profiler allocation events, above the bytes
live before the step: parameters, inputs and existing .grad are outside) and median step seconds,
for remat's executor, plain eager, torch.utils.checkpoint per block, and PyTorch's own
`activation_memory_budget` knapsack (min-cut partitioner through aot_module, no inductor).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.memory import measure_peak

Step = Callable[[], None]


def measure(steps: dict[str, Step], repeats: int) -> dict[str, dict[str, float]]:
    """Measured peak (MiB) and median step time (ms) of each step, side by side: each step runs
    once first (so .grad exists and lazy setup is done), then its peak is measured, then the
    timing runs in `repeats` interleaved rounds (one call of every step per round, the order
    rotated each round), so load from other processes and position in a round hit every
    variant alike."""
    torch.set_num_threads(1)
    peaks = {}
    for name, step in steps.items():
        step()
        peaks[name] = measure_peak(step).peak_bytes
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return {
        name: {
            "peak_MiB": peaks[name] / 2**20,
            "step_ms": statistics.median(times[name]) * 1e3 if repeats else math.nan,
        }
        for name in steps
    }


def loss_step(
    forward: Callable[..., torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    blocks: list[nn.Module] | None = None,
) -> Step:
    """A training step: forward to the scalar loss, backward; with `blocks`, each of them under
    torch.utils.checkpoint for the step."""

    def step() -> None:
        if blocks is None:
            forward(*inputs).backward()
            return
        with checkpointed_blocks(blocks):
            forward(*inputs).backward()

    return step


@contextmanager
def checkpointed_blocks(blocks: list[nn.Module]) -> Iterator[None]:
    """Wrap each block's forward in torch.utils.checkpoint (non-reentrant, RNG preserved)."""
    originals = [block.forward for block in blocks]
    try:
        for block, original in zip(blocks, originals, strict=True):
            block.forward = (  # type: ignore[method-assign]
                lambda *a, _f=original, **k: checkpoint(_f, *a, use_reentrant=False, **k)
            )
        yield
    finally:
        for block, original in zip(blocks, originals, strict=True):
            block.forward = original  # type: ignore[method-assign]


def knapsack_forward(model: nn.Module, budget: float) -> Callable[..., torch.Tensor]:
    """`model` through aot_function with the min-cut partitioner at activation_memory_budget
    `budget` (0..1: a bound on saved activation bytes relative to saving all, not a peak bound),
    no inductor. Parameters and buffers are passed as inputs (functional_call; tied weights
    appear once). Compiled on the first call, which runs inside the config patch."""
    import torch._functorch.config as functorch_config
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.func import functional_call

    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    tensors = [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]

    def functional(*args: torch.Tensor) -> torch.Tensor:
        state = dict(zip(names, args[: len(names)], strict=True))
        return functional_call(model, state, args[len(names) :])

    def identity(gm: torch.fx.GraphModule, _: object) -> Callable[..., object]:
        return make_boxed_func(gm)

    compiled = aot_function(
        functional,
        fw_compiler=identity,
        bw_compiler=identity,
        partition_fn=min_cut_rematerialization_partition,
    )

    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        with functorch_config.patch(activation_memory_budget=budget):
            return compiled(*tensors, *inputs)

    return forward
