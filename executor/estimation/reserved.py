"""Reserved memory per strategy, predicted (estimate mode, one process, a GPU target).

A job fails on the bytes the CUDA caching allocator has reserved, not on those its tensors hold.
Each row's plan (`CheckpointPlan.applied`) runs one more fake step of the recorded model, and
estimate mode's tracker logs every storage it makes and frees, in order, rounded as the target
rounds (`Estimate.sequencing`): the allocations torch's checkpoint and SAC runtime make under
that plan, in the CPU kernels' trace (a GPU's kernels can allocate otherwise: SDPA's backends,
cuDNN's workspaces, docs/estimate.md "Limits"). `training_sequence` puts it into a training
loop's steady state:

1. the parameters, buffers and inputs, each storage one allocation, before the first step;
2. two steps, each: the logged forward and backward; the optimizer's step (AdamW: the first
   step allocates its two moments per trainable parameter, interleaved as its `_init_group`
   does, and every step its foreach update allocates one square-root tensor per trainable
   parameter, per dtype group, freed when the next group's are made and after the last;
   SGD: the momentum buffers on the first step, no temporaries); `zero_grad(set_to_none=True)`
   frees the gradients (every storage the step made and still holds at its end).

`solver.target.caching_allocator.simulate` replays it under the allocator settings
(`AllocatorConfig`, a `PYTORCH_ALLOC_CONF` string) at the device's usable memory:
`ReservedBytes` holds the peak reserved and allocated bytes and whether an allocation fails.
The logged step's peak allocated bytes check the row's predicted total (`allocated`: the two
come from different code, the window model and the run itself).

Not predicted: under FSDP2 (its all-gathers and reduce-scatters allocate on their own streams;
the allocator model is one stream's), the offload row (copies on their own streams), and
measured mode (the CPU has no caching allocator). Memory outside the allocator is `Device`'s
`outside`, already deducted from the usable memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from executor.fitting.memory import OPTIMIZER_STATES
from executor.sac.plan import CheckpointPlan
from executor.sac.recording.estimate import Estimate
from executor.sac.recording.measurer import storage_key
from graph_capture.measurement.peak import Snapshot
from solver.target.caching_allocator import AllocatorConfig, simulate

Event = tuple[Hashable, int]
"""(key, bytes): an allocation of that many bytes, or the key's free where bytes is 0."""

STEPS = 2
"""Training steps replayed: the first allocates the optimizer's state, the second runs on the
segments the first left (the steady state)."""


@dataclass(frozen=True)
class LoggedStep:
    """One fake training step's allocations: `static` (bytes of each parameter's, buffer's and
    input's storage, made before it), `trainable` (bytes and dtype of each trainable
    parameter's storage, in `model.parameters()` order), `events` (its forward and backward,
    `Estimate.sequencing`'s) and `held` (the keys it makes and still holds at its end: the
    gradients)."""

    static: tuple[int, ...]
    trainable: tuple[tuple[int, torch.dtype], ...]
    events: tuple[Event, ...]
    held: tuple[Hashable, ...]


@dataclass(frozen=True)
class ReservedBytes:
    """A row's predicted CUDA memory over two training steps (bytes): `reserved` (peak
    ``memory_reserved`` where nothing limits it), `allocated` (peak ``memory_allocated``, the
    allocator's rounding included), `step_allocated` (the peak of the logged forward and
    backward with everything made before them: what the row's `total` predicts), `fits` (no
    allocation fails at the usable memory once the allocator releases its cached blocks) and
    `config` (the allocator settings, a `PYTORCH_ALLOC_CONF` string; "" for torch's
    defaults)."""

    reserved: int
    allocated: int
    step_allocated: int
    fits: bool
    config: str


def _storages(tensors: Sequence[torch.Tensor], measurer: Estimate) -> list[int]:
    """Bytes of each distinct storage among `tensors`, as the target rounds them."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen.setdefault(storage_key(t), measurer.nbytes(t))
    return list(seen.values())


def log_step(
    model: nn.Module,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    measurer: Estimate,
    plan: CheckpointPlan | None,
) -> LoggedStep:
    """One fake training step of `model` under `plan` (None: nothing checkpointed), logged
    (`LoggedStep`); the model, its `.grad`, buffers and generator states are left as found."""
    with measurer.running(model, (list(inputs), dict(kwargs))) as (args, kw):
        params = list(dict.fromkeys(model.parameters()))
        tensors = [*params, *model.buffers()]
        tensors += [t for t in (*args, *kw.values()) if isinstance(t, torch.Tensor)]
        trainable = [(measurer.nbytes(p), p.dtype) for p in params if p.requires_grad]
        snapshot = Snapshot(model)
        model.zero_grad(set_to_none=True)
        try:
            with _applied(plan, model), measurer.sequencing() as events:
                loss = loss_fn(model(*args, **kw))
                loss.backward()
                del loss
                held = _held(events)
        finally:
            snapshot.restore()
        static = tuple(_storages(tensors, measurer))
        return LoggedStep(static, tuple(trainable), tuple(events), held)


def _applied(plan: CheckpointPlan | None, model: nn.Module) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if plan is None else plan.applied(model)


def _held(events: Sequence[Event]) -> tuple[Hashable, ...]:
    """The keys allocated in `events` and not freed after."""
    live: dict[Hashable, None] = {}
    for key, nbytes in events:
        if nbytes:
            live[key] = None
        else:
            live.pop(key, None)
    return tuple(live)


def training_sequence(logged: LoggedStep, optimizer: str, steps: int = STEPS) -> list[Event]:
    """The allocations and frees of `steps` training steps (module docstring), the logged
    step's keys told apart per step."""
    events: list[Event] = [(("static", i), b) for i, b in enumerate(logged.static)]
    moments = OPTIMIZER_STATES[optimizer]
    groups: dict[torch.dtype, list[int]] = {}
    for i, (_, dtype) in enumerate(logged.trainable):
        groups.setdefault(dtype, []).append(i)
    for s in range(steps):
        events += [((s, key), nbytes) for key, nbytes in logged.events]
        if s == 0:
            events += [
                (("state", i, m), b)
                for i, (b, _) in enumerate(logged.trainable)
                for m in range(moments)
            ]
        if optimizer == "adamw":
            previous: list[int] = []
            for members in groups.values():
                events += [(("sqrt", s, i), logged.trainable[i][0]) for i in members]
                events += [(("sqrt", s, i), 0) for i in previous]
                previous = members
            events += [(("sqrt", s, i), 0) for i in previous]
        events += [((s, key), 0) for key in logged.held]
    return events


def step_allocated(logged: LoggedStep, optimizer: str) -> int:
    """Peak bytes while the logged forward and backward run, in a steady state: the static
    storages, the optimizer's state and the step's own bytes (unrounded by the allocator's
    blocks beyond the target's rounding), as the row's `total` counts them."""
    moments = OPTIMIZER_STATES[optimizer]
    before = sum(logged.static) + moments * sum(b for b, _ in logged.trainable)
    live = peak = 0
    sizes: dict[Hashable, int] = {}
    for key, nbytes in logged.events:
        if nbytes:
            sizes[key] = nbytes
            live += nbytes
            peak = max(peak, live)
        else:
            live -= sizes.pop(key, 0)
    return before + peak


def predict_reserved(logged: LoggedStep, optimizer: str, conf: str, usable: int) -> ReservedBytes:
    """The row's `ReservedBytes`: its training sequence replayed under the allocator settings
    `conf` (a `PYTORCH_ALLOC_CONF` string, "" for torch's defaults) with no limit (the peaks),
    and at `usable` bytes (whether an allocation fails once the cached blocks are released)."""
    config = AllocatorConfig.parse(conf)
    events = training_sequence(logged, optimizer)
    unlimited = simulate(events, config)
    return ReservedBytes(
        unlimited.peak_reserved,
        unlimited.peak_allocated,
        step_allocated(logged, optimizer),
        simulate(events, config, usable).fits,
        conf,
    )
