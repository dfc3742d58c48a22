"""`executor.estimate`'s rows against real steps here (CPU): per strategy, each predicted
component of the peak per rank beside the one measured on a real training step run under the
row's plan.

    python -m benchmarks.planning.estimate_check [--models transformer gpt2 cnn] [--layers 3]

For each model, `executor.estimate` is run twice: measured here (`target=None`: its
recording's windows measured) and in estimate mode (`target="cpu"`: fake tensors, nothing
real runs). Each row's `plan` is then applied to a fresh copy of the model
(`CheckpointPlan.apply`), one AdamW step is taken (the optimizer's state exists, `.grad` None
after `zero_grad`), and the next step (forward, loss, backward) is measured
(`measured_components`):

- parameters, optimizer states, other (buffers and inputs): the distinct storages resident
  before the step (bytes);
- the step: the profiler's allocation events (CPU allocator, requested bytes, with their
  addresses); at the most bytes live, the gradients are the live storages that end the step
  as a parameter's `.grad` whose group (`executor.estimation.grad_groups.GradGroups`: per
  block, the head, the stem) had all its gradients allocated by then, what
  `solver.target.components` counts as gradients; activations are the rest.

The saved/transient split is the windows' (the bytes live at the peak window's start): the
measured recording's windows beside the fake step's, in the two estimates. One thread.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from executor.estimation import StepEstimate, estimate
from executor.estimation.grad_groups import GradGroups, grad_groups
from graph_capture.measurement.peak import event_tree, is_allocation, memory_profile

PARTS = ("parameters", "gradients", "optimizer_states", "activations", "other", "total")
"""The components compared: the predicted saved activations and transient are `activations`."""


def _storages(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages of `tensors`."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _events(prof: torch.profiler.profile) -> list[tuple[int, int, int]]:
    """(time ns, bytes + or -, address) of every CPU allocation and free, in time order."""
    found = [
        (node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr)
        for node, _ in event_tree(prof)
        if is_allocation(node)
    ]
    return sorted(found, key=lambda e: e[0])


def _peak(events: list[tuple[int, int, int]]) -> tuple[int, int, dict[int, int]]:
    """(the most bytes live above the start, its time, the allocations live then by address:
    bytes)."""
    live, total, best, at = {}, 0, 0, -1
    for k, (_, size, _) in enumerate(events):
        total += size
        if total > best:
            best, at = total, k
    for _, size, ptr in events[: at + 1]:
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    return best, events[at][0] if at >= 0 else 0, live


def _complete_grads(
    groups: GradGroups, events: list[tuple[int, int, int]], when: int, live: dict[int, int]
) -> int:
    """Bytes of the live gradients at time `when` whose group's gradients were all allocated
    by then (each parameter's `.grad` storage after the step, at its last allocation)."""
    allocated: dict[int, int] = {}
    for t, size, ptr in events:
        if size > 0:
            allocated[ptr] = t
    total = 0
    for params in (*groups.blocks, groups.head, groups.stem):
        ptrs = [p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None]
        times = [allocated.get(ptr, 0) for ptr in ptrs]
        if params and len(ptrs) == len(params) and max(times) <= when:
            total += sum(live.get(ptr, 0) for ptr in set(ptrs))
    return total


def measured_components(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    loss_fn: Callable[[object], torch.Tensor],
    plan,
    blocks: Sequence[str],
) -> dict[str, int]:
    """The components (`PARTS`, bytes) of a real step of a copy of `model` under `plan` (a
    `CheckpointPlan`, or None: plain), after one AdamW step, measured here."""
    model = copy.deepcopy(model)
    if plan is not None:
        plan.apply(model)
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> torch.Tensor:
        return loss_fn(model(*inputs, **kwargs))

    step().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    modules = dict(model.named_modules())
    with torch.no_grad():
        groups = grad_groups(model, [(b, modules[b]) for b in blocks], step)
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    with memory_profile() as prof:
        step().backward()
    events = _events(prof)
    peak, when, live = _peak(events)
    grads = _complete_grads(groups, events, when, live)
    parts = {
        "parameters": _storages(list(model.parameters())),
        "gradients": grads,
        "optimizer_states": _storages(state),
        "activations": peak - grads,
        "other": _storages([*model.buffers(), *inputs, *kwargs.values()]),
    }
    parts["total"] = sum(parts.values())
    return parts


def predicted_parts(est: StepEstimate, name: str) -> dict[str, int]:
    """The row `name`'s components as `PARTS`."""
    c = est.strategy(name).components
    assert c is not None
    parts = {
        "parameters": c.parameters,
        "gradients": c.gradients,
        "optimizer_states": c.optimizer_states,
        "activations": c.saved_activations + c.transient,
        "other": c.other,
    }
    parts["total"] = c.total
    return parts


def compare(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    loss_fn: Callable[[object], torch.Tensor],
    kwargs: Mapping[str, torch.Tensor] | None = None,
    time_limit: float = 60,
) -> dict[str, dict[str, dict[str, int]]]:
    """Per strategy with a plan: {"measured": parts, "recorded": parts, "fake": parts}: the
    real step's, and the two estimates' (measured recording, estimate mode for `cpu`)."""
    kwargs = dict(kwargs or {})
    common = {"example_kwargs": kwargs, "loss_fn": loss_fn, "time_limit": time_limit}
    recorded = estimate(model, inputs, **common)
    fake = estimate(model, inputs, target="cpu", **common)
    out = {}
    for row in recorded.strategies:
        if row.plan is None:
            continue
        blocks = _blocks(row.plan)
        out[row.name] = {
            "measured": measured_components(model, inputs, kwargs, loss_fn, row.plan, blocks),
            "recorded": predicted_parts(recorded, row.name),
            "fake": predicted_parts(fake, row.name),
        }
    return out


def _blocks(plan) -> list[str]:
    """The blocks of a plan's regions (each block is followed by its children, if any)."""
    names = list(plan.regions)
    return [n for n in names if not any(n.startswith(m + ".") for m in names)]
