"""Measured training steps: peak activation bytes (profiler allocation events, above the bytes
live before the step: parameters, inputs and existing .grad are outside) and median step seconds,
for remat's executor, plain eager, torch.utils.checkpoint per block, and PyTorch's own
`activation_memory_budget` knapsack (min-cut partitioner through torch.compile with an
AOTAutograd backend, no inductor).
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
    """Measured peak (MiB, `measure_peaks`) and median step time (ms, `interleaved_times`) of
    each step, side by side."""
    peaks = measure_peaks(steps)
    times = interleaved_times(steps, repeats)
    return {
        name: {
            "peak_MiB": peaks[name] / 2**20,
            "step_ms": statistics.median(times[name]) * 1e3 if repeats else math.nan,
        }
        for name in steps
    }


def measure_peaks(steps: dict[str, Step]) -> dict[str, int]:
    """Measured peak bytes of each step (one thread): each runs once first (so .grad exists and
    lazy setup is done), then once under `measure_peak`, with the global RNG state restored."""
    torch.set_num_threads(1)
    peaks = {}
    for name, step in steps.items():
        with torch.random.fork_rng(devices=[]):
            step()
            peaks[name] = measure_peak(step).peak_bytes
    return peaks


def interleaved_times(steps: dict[str, Step], rounds: int) -> dict[str, list[float]]:
    """Seconds of each step in each of `rounds` interleaved rounds (one call of every step per
    round, the order rotated each round), so load from other processes and position in a
    round hit every variant alike; ``times[name][r]`` is round r's."""
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return times


def loss_step(
    forward: Callable[..., torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    blocks: list[nn.Module] | None = None,
    segments: int | None = None,
) -> Step:
    """A training step: forward to the scalar loss, backward; with `blocks`, under
    `checkpointed_blocks(blocks, segments)` for the step."""

    def step() -> None:
        if blocks is None:
            forward(*inputs).backward()
            return
        with checkpointed_blocks(blocks, segments):
            forward(*inputs).backward()

    return step


def sequential_segments(n: int, segments: int) -> list[range]:
    """The block ranges `torch.utils.checkpoint.checkpoint_sequential` checkpoints for `n`
    blocks in `segments` segments: ``n // segments`` blocks each, all but the last segment
    (the rest of the blocks), which it runs without checkpointing."""
    size = n // segments
    return [range(start, start + size) for start in range(0, size * (segments - 1), size)]


@contextmanager
def checkpointed_blocks(blocks: list[nn.Module], segments: int | None = None) -> Iterator[None]:
    """Wrap the blocks in torch.utils.checkpoint (non-reentrant, RNG preserved): each block on
    its own (``segments=None``), or consecutive blocks as `checkpoint_sequential` partitions
    them into ``segments`` (`sequential_segments`). The blocks form a chain called in order
    with the hidden state first (extra arguments, e.g. HF attention masks, are passed to every
    block): a segment's first block runs the whole segment under one checkpoint and its other
    blocks pass the result through."""
    ranges = (
        [range(i, i + 1) for i in range(len(blocks))]
        if segments is None
        else sequential_segments(len(blocks), segments)
    )
    originals = [block.forward for block in blocks]
    try:
        for members in ranges:
            forwards = [originals[i] for i in members]
            blocks[members[0]].forward = _checkpointed(forwards)  # type: ignore[method-assign]
            for i in members[1:]:
                blocks[i].forward = _pass_through  # type: ignore[method-assign]
        yield
    finally:
        for block, original in zip(blocks, originals, strict=True):
            block.forward = original  # type: ignore[method-assign]


def _checkpointed(forwards: list[Callable[..., torch.Tensor]]) -> Callable[..., torch.Tensor]:
    def run(hidden: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        for forward in forwards:
            hidden = forward(hidden, *args, **kwargs)
        return hidden

    return lambda *a, **k: checkpoint(run, *a, use_reentrant=False, **k)


def _pass_through(hidden: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return hidden


def knapsack_forward(model: nn.Module, budget: float) -> Callable[..., torch.Tensor]:
    """`model` through torch.compile with an AOTAutograd backend that runs the graphs as they
    are (no inductor, no decompositions) and partitions them with the min-cut partitioner at
    activation_memory_budget `budget` (0..1: a bound on saved activation bytes relative to
    saving all, not a peak bound). Dynamo splits the model where it has data-dependent Python
    (HF mask helpers), which tracing the whole model at once cannot. Compiled on the first
    call; every call runs inside the config patch, so a recompile keeps `budget` (a new
    backend object per call of this function, so several budgets coexist)."""
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def identity(gm: torch.fx.GraphModule, _: object) -> Callable[..., object]:
        return make_boxed_func(gm)

    backend = aot_autograd(
        fw_compiler=identity,
        bw_compiler=identity,
        partition_fn=min_cut_rematerialization_partition,
    )
    compiled = torch.compile(model, backend=backend, dynamic=False)

    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        with functorch_config.patch(activation_memory_budget=budget):
            return compiled(*inputs)

    return forward
