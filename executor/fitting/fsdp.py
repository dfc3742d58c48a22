"""A model's per-rank FSDP2 bytes for `fit(..., world_size=N)`: its groups as `fully_shard`
would make them (one per repeated block, `executor.sac.blocks.default_blocks`, in the order the
model registers them, and the root's remaining parameters), measured by
`solver.target.fsdp_memory` (docs/fsdp.md) and counted by `solver.fitting.fsdp.FsdpBytes`."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from executor.errors import FitError, PlanError
from executor.sac.blocks import default_blocks
from solver.fitting.fsdp import FsdpBytes
from solver.target import FsdpPolicy, fsdp_memory

FSDP_OPTIONS = ("master_dtype", "param_dtype", "reduce_dtype", "reshard_after_forward", "backend")
"""The `FsdpPolicy` fields a fit's caller sets (`fit(..., fsdp=...)`); the world size, the
optimizer and the allocator's rounding come from the fit's own arguments."""

_OPTIMIZER = {"adamw": "adamw", "sgd": "sgd_momentum", "none": "none"}
"""fit's optimizers (`executor.fitting.memory.OPTIMIZERS`) as `FsdpPolicy` names them."""


def fsdp_bytes(
    model: nn.Module,
    world_size: int,
    optimizer: str,
    rounding: int,
    options: Mapping[str, object] | None = None,
) -> FsdpBytes:
    """Rank 0's FSDP2 bytes for `model` (built in the compute dtype: its graph is the rank's
    step) over `world_size` ranks, trained with fit's `optimizer`, every allocation rounded up
    to `rounding` bytes. `options`: `FSDP_OPTIONS` (default: master dtype the model's,
    no mixed precision, `reshard_after_forward=True`, backend "nccl"). FitError where the model
    has frozen parameters, parameters of several dtypes, or a dtype other than the policy's
    compute dtype, or no repeated blocks."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(FSDP_OPTIONS))
    if unknown:
        raise ValueError(f"unknown FSDP options {unknown}: use {', '.join(FSDP_OPTIONS)}")
    params = list(model.parameters())
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise FitError(
            f"world_size > 1: frozen parameters ({frozen[:3]}) are not in the FSDP model, "
            "which gives every parameter a gradient and optimizer state; fit them unsharded"
        )
    dtypes = {str(p.dtype).removeprefix("torch.") for p in params}
    if len(dtypes) != 1:
        raise FitError(f"world_size > 1 needs the parameters in one dtype, not {sorted(dtypes)}")
    (dtype,) = dtypes
    policy = FsdpPolicy(
        world_size,
        optimizer=_OPTIMIZER[optimizer],
        rounding=rounding,
        **{"master_dtype": dtype, **options},  # type: ignore[arg-type]
    )
    if policy.compute_dtype != dtype:
        raise FitError(
            f"the model is built in {dtype} and FSDP computes in {policy.compute_dtype}: build "
            f"it in {policy.compute_dtype} (the graph is traced in the dtype it is built in) and "
            "give the master dtype as master_dtype"
        )
    try:
        names = default_blocks(model)
    except PlanError as e:
        raise FitError(f"world_size > 1: the blocks to shard: {e}") from e
    modules = dict(model.named_modules())
    in_blocks: set[int] = set()
    blocks = []
    for name in names:
        shapes = []
        for p in modules[name].parameters():
            if id(p) not in in_blocks:
                in_blocks.add(id(p))
                shapes.append(tuple(p.shape))
        blocks.append(shapes)
    root = [tuple(p.shape) for p in params if id(p) not in in_blocks]
    try:
        memory = fsdp_memory(blocks, root, policy)
    except ValueError as e:
        raise FitError(f"world_size > 1: {e}") from e
    return FsdpBytes(world_size, len(blocks), memory)
