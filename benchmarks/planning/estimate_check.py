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
  block, the head, the stem) was complete by then, as `solver.target.components` counts
  them: a block's once its backward has ended (its inputs' first gradient computed, marked
  in the profile as the recording marks it), the head's once the blocks' backward has
  started (the last block's output's first gradient), the stem's at the step's end (the
  peak still held after the last event); activations are the rest (a gradient whose block's
  backward is still running among them).

The saved/transient split is the windows' (the bytes live at the peak window's start): the
measured recording's windows beside the fake step's, in the two estimates. One thread.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch._C._profiler import _RecordFunctionFast

from executor.estimation import StepEstimate, estimate
from executor.estimation.grad_groups import GradGroups, grad_groups
from executor.sac.recording.windows import on_first_gradient
from executor.sac.step import hooked
from graph_capture.measurement.peak import (
    event_tree,
    is_allocation,
    marked_windows,
    memory_profile,
)

MARK = "remat.check:"
"""The profiler event name prefix of `_marked_step`'s marks."""

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
    groups: GradGroups, done: Sequence[int | None], when: int, last: int, live: dict[int, int]
) -> int:
    """Bytes of the live gradients (`live`: address to bytes) at time `when` whose group was
    complete by then: `done`, each block's completion time then the head's; the stem's at
    `last`, the step's last event."""
    total = 0
    complete = [*zip(groups.blocks, done[:-1], strict=True), (groups.head, done[-1])]
    for params, at in (*complete, (groups.stem, last)):
        if (last if at is None else at) <= when:
            total += sum(live.get(p.grad.untyped_storage().data_ptr(), 0) for p in params)
    return total


def _marked_step(
    step: Callable[[], torch.Tensor], blocks: Sequence[nn.Module]
) -> tuple[torch.profiler.profile, list[int | None]]:
    """Run and profile `step().backward()` with marks where each block's backward ends and
    where the blocks' backward starts: the profile and those marks' times (ns), per block in
    forward order, then the head's (None: not made, the step's end)."""
    labels: list[str] = []

    def mark(label: str) -> None:
        with _RecordFunctionFast(f"{MARK}{len(labels)}"):
            labels.append(label)

    def block_inputs(j: int):
        return lambda _m, args, kwargs: on_first_gradient((args, kwargs), mark, str(j))

    handles = [
        b.register_forward_pre_hook(block_inputs(j), with_kwargs=True) for j, b in enumerate(blocks)
    ]
    handles.append(
        blocks[-1].register_forward_hook(lambda _m, _a, out: on_first_gradient(out, mark, "head"))
    )
    with hooked(handles), memory_profile() as prof:
        step().backward()
    times: dict[str, int | None] = {}
    for label, (start, _) in zip(labels, marked_windows(prof, MARK), strict=True):
        times.setdefault(label, start)  # the first: a recomputed forward marks again
    # a block whose inputs need no gradient (the model's first) ends with the step
    return prof, [times.get(label) for label in [*map(str, range(len(blocks))), "head"]]


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
    prof, done = _marked_step(step, [modules[b] for b in blocks])
    events = _events(prof)
    peak, when, live = _peak(events)
    grads = _complete_grads(groups, done, when, events[-1][0], live)
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


def _worst(got: Mapping[str, Mapping[str, int]], kind: str) -> tuple[float, str]:
    """The largest difference of a predicted component from the measured one, percent of the
    measured, and that component."""
    return max(
        (100 * abs(got[kind][p] - got["measured"][p]) / max(got["measured"][p], 1), p)
        for p in PARTS
    )


def table(results: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]]) -> str:
    """A markdown table: per model and strategy, the measured and predicted totals (bytes) and
    each estimate's largest component difference."""
    lines = [
        "| model | strategy | measured total | predicted: measured recording | "
        "predicted: estimate mode | largest difference: recording | estimate mode |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, rows in results.items():
        for strategy, got in rows.items():
            rec, fake = _worst(got, "recorded"), _worst(got, "fake")
            lines.append(
                f"| {model} | {strategy} | {got['measured']['total']:,} | "
                f"{got['recorded']['total']:,} | {got['fake']['total']:,} | "
                f"{rec[0]:.2f}% ({rec[1]}) | {fake[0]:.2f}% ({fake[1]}) |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from benchmarks.zoo import ZOO, gpt2, llama

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama", "resnet18"])
    parser.add_argument("--layers", type=int, default=3, help="of gpt2 and llama")
    parser.add_argument("--time-limit", type=float, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sized = {"gpt2": lambda: gpt2(layers=args.layers), "llama": lambda: llama(layers=args.layers)}
    results = {}
    for name in args.models:
        model, inputs = sized[name]() if name in sized else ZOO[name]()
        results[name] = compare(model, inputs, lambda out: out, time_limit=args.time_limit)
    print(table(results))


if __name__ == "__main__":
    main()
