"""The plain step's memory windows around blocks and their children (`measure_windows`):
live and peak bytes, cut at marks made by module hooks, from the profiler's allocation events
(or, in estimate mode, the storages a fake step creates and frees:
`executor.sac.recording.measurer`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn

from executor.errors import PlanError
from executor.sac.recording.measurer import Measurer, Timeline
from executor.sac.step import LossClosure, Snapshot, hooked, leaf_tensors
from solver.sac.windows import (
    WindowError,
    Windows,
    cut_windows,
    largest_at_peaks,
    live_at,
    peak_after,
)

BACKWARD_START = "bw"
"""The mark made when the loss is computed, before its backward (`Windows.backward_start`)."""
ROOT_BACKWARD = "rb"
"""The mark made when block 0's inputs' gradients are complete (`Windows.root_b_start`)."""


def on_first_gradient(tensors: object, mark: Callable[[str], None], label: str) -> None:
    """Make the mark `label` when the first gradient of the tensors among `tensors` (a pytree)
    that require grad is computed."""
    fired = []

    def hook(grad: torch.Tensor) -> None:
        if not fired:
            fired.append(True)
            mark(label)

    for t in leaf_tensors(tensors):
        if t.requires_grad:
            t.register_hook(hook)


def measure_windows(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    step: LossClosure,
    children: Sequence[Sequence[nn.Module] | None] | None = None,
    measurer: Measurer | None = None,
) -> Windows:
    """The plain step's live and peak bytes per window (module docstring, step 1); with
    `children` (per block, its children in call order, or None), the children's windows and
    the block's stretches outside them too, from the same step, for each block whose children
    run once each, in sequence (`splits[j]`: (f_start, f_peak, b_start, b_peak) per child, or
    None; `inner[j]`: the block's stretches outside its children). Bytes and marks come from
    `measurer`'s timeline (default `Measurer`: the profiler's allocation events)."""
    measurer = measurer or Measurer()
    children = list(children) if children is not None else [None] * len(blocks)
    marks: list[str] = []
    lines: list[Timeline] = []

    def mark(label: str) -> None:
        lines[0].mark()
        marks.append(label)

    def on_leave(label: str, out: object) -> None:
        mark(f"fe{label}")
        on_first_gradient(out, mark, f"bs{label}")

    def root_backward(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        on_first_gradient((args, kwargs), mark, ROOT_BACKWARD)  # block 0's backward ends

    regions = [(str(j), b) for j, b in enumerate(blocks)]
    for j, kids in enumerate(children):
        regions += [(f"{j}.{c}", m) for c, m in enumerate(kids or [])]
    snapshot = Snapshot(model)
    model.zero_grad(set_to_none=True)
    handles = [blocks[0].register_forward_pre_hook(root_backward, with_kwargs=True)]
    for label, module in regions:
        handles.append(module.register_forward_pre_hook(lambda _m, _a, x=label: mark(f"fs{x}")))
        handles.append(module.register_forward_hook(lambda _m, _a, o, x=label: on_leave(x, o)))
    try:
        with hooked(handles), measurer.timeline() as line:
            lines.append(line)
            loss = step()
            mark(BACKWARD_START)
            loss.backward()
            del loss
    finally:
        snapshot.restore()
    counts = [None if not k or len(k) < 2 else len(k) for k in children]
    return _cut(line, marks, counts)


def _cut(line: Timeline, marks: list[str], counts: list[int | None]) -> Windows:
    """The windows of the timeline `line` cut at its `marks` (`cut_windows`), with the bytes
    live at the backward's start, the root's backward and the step's end."""
    times = dict(zip(marks, line.times, strict=True))
    extra = (BACKWARD_START, ROOT_BACKWARD)
    kept = [(m, t) for m, t in zip(marks, line.times, strict=True) if m not in extra]
    root = times.get(ROOT_BACKWARD)
    try:
        windows = cut_windows(
            [t for _, t in kept], line.events, [m for m, _ in kept], counts, until=root
        )
    except WindowError as e:
        raise PlanError(str(e)) from e
    return replace(
        windows,
        backward_start=live_at(line.events, times[BACKWARD_START]),
        root_b_start=None if root is None else live_at(line.events, root),
        root_b_peak=None if root is None else peak_after(line.events, root),
        end=sum(size for _, size in line.events),
        largest=largest_at_peaks(line.allocations, _window_spans(times, len(counts))),
    )


def _window_spans(times: dict[str, int], blocks: int) -> list[tuple[str, int, int | None]]:
    """The step's windows (`window_names`' names) as (name, start time, end time or None: the
    step's end), from the marks' `times`."""
    root = times.get(ROOT_BACKWARD)
    out = [("root forward", -1, times["fs0"])]
    for k in range(blocks):
        out.append((f"forward {k}", times[f"fs{k}"], times[f"fe{k}"]))
        if k < blocks - 1:
            out.append((f"between {k}", times[f"fe{k}"], times[f"fs{k + 1}"]))
    out.append(("head", times[f"fe{blocks - 1}"], times[f"bs{blocks - 1}"]))
    for k in reversed(range(blocks)):
        out.append((f"backward {k}", times[f"bs{k}"], times[f"bs{k - 1}"] if k else root))
    return out + ([("root backward", root, None)] if root is not None else [])
