"""FSDP2 for the executor's planners: the policy a plan or a fit is made for, and a model's
groups as `fully_shard` makes them, in bytes by the torch-free model `solver.target.fsdp`
(docs/fsdp.md).

NOTE [ one FSDP policy ]: ``fsdp=`` takes a `solver.target.FsdpPolicy` wherever it is an
argument (`checkpoint_plan`, `fit`; the CLI builds one with `fsdp_policy`); anything else, a
mapping of options included, is refused in one line. The type lives in `solver.target` because
the memory model it parameterises is torch-free (the solver never imports torch); the executor
re-exports it and adds only what needs a model or a target:

- `fsdp_policy`: the one set of defaults, FsdpPolicy's own fields with what the target fixes;
- `resolve_policy`: the policy of a call, the default for the model (its dtype gathered) where
  none is given, else the given one checked against the model, the target and the call;
- `model_memory`: the model's per-rank bytes, each parameter in one group.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from executor.errors import PlanError
from graph_capture.measurement.roofline import resolve_target
from solver.target import Device, FsdpMemory, FsdpPolicy, fsdp_memory

__all__ = ["FsdpPolicy", "fsdp_policy", "model_memory", "resolve_policy", "sharded_world_size"]


def fsdp_policy(
    world_size: int, target: str | Device | None = None, **fields: object
) -> FsdpPolicy:
    """The policy for `world_size` ranks on `target` (a name, device file or `Device`; None:
    this machine's CPU): `FsdpPolicy`'s defaults (float32 master weights, no mixed precision,
    AdamW, resharded after forward, rank 0's rows) with what the target fixes: its allocator's
    rounding (bytes), the collectives (gloo on a device with CPU kernels, NCCL on a GPU) and
    where AdamW's step counters live (on a CPU device; a GPU's optimizer keeps them on the
    host). `fields` set any of FsdpPolicy's fields (`param_dtype="bfloat16"`, ...)."""
    device = None if target is None else resolve_target(target)
    cpu = device is None or device.kernels == "cpu"
    defaults: dict[str, object] = {
        "rounding": 1 if device is None else device.rounding,
        "backend": "gloo" if cpu else "nccl",
        "step_counters_on_device": cpu,
    }
    return FsdpPolicy(world_size, **{**defaults, **fields})  # type: ignore[arg-type]


def given_policy(fsdp: object) -> FsdpPolicy | None:
    """`fsdp` where it is an `FsdpPolicy` or None; PlanError (one line) for anything else."""
    if fsdp is None or isinstance(fsdp, FsdpPolicy):
        return fsdp
    raise PlanError(
        f"fsdp= takes an FsdpPolicy, not {type(fsdp).__name__}: build one with "
        "executor.fsdp_policy(world_size, target, param_dtype=..., ...) (NOTE [ one FSDP "
        "policy ] in executor/fsdp.py)"
    )


def sharded_world_size(world_size: int, fsdp: object) -> int:
    """The ranks a call plans for: `world_size`, or the given policy's where `world_size` is 1
    (PlanError where both are given and differ, or `fsdp` is not a policy)."""
    policy = given_policy(fsdp)
    if policy is None:
        return world_size
    if world_size not in (1, policy.world_size):
        raise PlanError(
            f"world_size={world_size} and fsdp.world_size={policy.world_size} differ: give one"
        )
    return policy.world_size


def resolve_policy(
    model: nn.Module,
    world_size: int,
    fsdp: object,
    target: Device | None,
    optimizer: str | None = None,
) -> FsdpPolicy:
    """The policy a call plans `model` under on `target` (None: this machine's CPU): `fsdp`
    where given, checked against the call (its world size, the target's rounding, the fit's
    `optimizer` in FsdpPolicy's names) and the model (its dtype is the gathered one: the step
    is traced in the dtype the model is built in); else `fsdp_policy` with the model's dtype
    gathered (`optimizer` where given). PlanError (one line) for a disagreement, a model with
    parameters of several dtypes or frozen ones (FSDP's model gives every parameter a
    gradient and optimizer state)."""
    world_size = sharded_world_size(world_size, fsdp)
    dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
    if len(dtypes) != 1:
        raise PlanError(
            f"FSDP needs one parameter dtype (the param dtype it gathers in); the model has "
            f"{sorted(dtypes)}: build it in the param dtype"
        )
    (dtype,) = dtypes
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise PlanError(
            f"frozen parameters ({frozen[:3]}) are not in the FSDP model, which gives every "
            "parameter a gradient and optimizer state: plan them unsharded"
        )
    policy = given_policy(fsdp)
    if policy is None:
        chosen = {} if optimizer is None else {"optimizer": optimizer}
        return fsdp_policy(world_size, target, param_dtype=dtype, **chosen)
    rounding = 1 if target is None else target.rounding
    if policy.rounding != rounding:
        raise PlanError(
            f"fsdp.rounding={policy.rounding} is not the target's allocator rounding "
            f"{rounding}: build the policy with executor.fsdp_policy(world_size, target, ...), "
            "which takes it from the target"
        )
    if optimizer is not None and policy.optimizer != optimizer:
        raise PlanError(
            f"fsdp.optimizer {policy.optimizer!r} is not the fit's {optimizer!r}: give the "
            "policy the fit's optimizer"
        )
    if policy.compute_dtype != dtype:
        raise PlanError(
            f"the FSDP policy gathers parameters in {policy.compute_dtype}, the model's are "
            f"{dtype}: the step is traced in the model's dtype, so build the model in "
            f"{policy.compute_dtype} (torch.set_default_dtype before building on meta)"
        )
    return policy


def model_memory(model: nn.Module, blocks: Sequence[nn.Module], policy: FsdpPolicy) -> FsdpMemory:
    """FSDP2's per-rank memory for `fully_shard` on each of `blocks` (in forward order) and at
    the root: each parameter in the first block that holds it (FSDP2 manages a parameter in one
    group), the root's the ones no block holds. PlanError where a parameter cannot be sharded
    (a 0-dimensional one)."""
    seen: set[int] = set()
    groups = []
    for block in blocks:
        shapes = []
        for p in block.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                shapes.append(tuple(p.shape))
        groups.append(shapes)
    root = [tuple(p.shape) for p in model.parameters() if id(p) not in seen]
    try:
        return fsdp_memory(groups, root, policy)
    except ValueError as e:
        raise PlanError(f"FSDP: {e}") from e
