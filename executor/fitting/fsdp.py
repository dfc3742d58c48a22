"""A model's per-rank FSDP2 bytes for `fit(..., world_size=N)`: `fully_shard` on each of the
model's repeated blocks (`executor.sac.recording.blocks.default_blocks`, in the order its forward
calls them) and at the root, under the call's policy (`executor.fsdp`, NOTE [ one FSDP policy ]),
counted by `solver.fitting.fsdp.FsdpBytes`. The forward that gives the order runs on fake tensors
(`graph_capture.measurement.estimate.fake_step`), as estimate mode's capture does: a meta-built
model runs there (HF Llama's mask reads a value with `.item()`, which a meta tensor refuses and
transformers skips for a fake one), and a CPU-built one allocates nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from executor.errors import FitError, PlanError
from executor.fsdp import model_memory
from executor.sac.recording.blocks import select_blocks
from executor.sac.step import in_call_order
from graph_capture.measurement.estimate import fake_step
from solver.fitting.fsdp import FsdpBytes
from solver.target import FsdpPolicy


def fsdp_bytes(
    model: nn.Module,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    policy: FsdpPolicy,
) -> FsdpBytes:
    """Rank 0's FSDP2 bytes for `model` (built in the policy's gathered dtype: its graph is the
    rank's step) under `policy`; the blocks' order is the one a forward on the inputs (without
    grad) calls them in. FitError where the model has no repeated blocks."""
    try:
        named = select_blocks(model, None)
        with fake_step(model, inputs, kwargs) as fake:

            def forward() -> None:
                with fake.mode:
                    model(*fake.inputs, **fake.kwargs)

            order = in_call_order(model, named, forward)
        blocks = [m for _, m in order]
        memory = model_memory(model, blocks, policy)
    except PlanError as e:
        raise FitError(f"world_size > 1: {e}") from e
    return FsdpBytes(policy.world_size, len(blocks), memory)
