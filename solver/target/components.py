"""What a rank's memory holds at a step's peak, by component (`Components`), from the step's
per-rank model (`FsdpMemory`: FSDP2's, or `plain_memory`'s for one process) and its
single-process activation windows (`StepWindows`). Torch-free; bytes throughout.

At the peak moment (`latest_peak`: `predict_peak`'s bytes, the latest moment holding them),
the rank holds:

- `parameters`: the resident parameters (FSDP2: the local shards; one process: all of them);
- `optimizer_states`: the optimizer's resident state (AdamW's two moments, SGD's momentum);
- `gradients`: FSDP2's sharded gradients reduced so far, and the unsharded gradients complete
  and not reduced yet (one process: every complete one): the head's (parameters first used
  after the last block) once the blocks' backward starts, every block's whose backward has
  ended, the rest of the root's (embeddings) at the step's end (`finished_grads`); a gradient
  still forming (its block's backward running, a tied parameter's) counts as activations:
  the windows do not say when within a backward it forms;
- `fsdp_buffers`: FSDP2's all-gather inputs and outputs, unsharded parameters and
  reduce-scatter buffers live then (0 in one process);
- `saved_activations`: the activation bytes live at the start of the window the peak falls in
  (what the step holds for its backward then), less the gradients above;
- `transient`: the rest of the window's activation bytes at the peak (what the window's own
  ops allocate: its saved outputs, recomputation and temporaries);
- `other`: bytes outside the model (buffers and inputs), given by the caller.

`total` is their sum: `predict_peak(memory, windows).peak + other`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from solver.target.fsdp import FsdpMemory, Moment
from solver.target.rank_peak import StepWindows

SHARDED_GRADS = "sharded grads"
"""The prefix of `Moment.parts` naming FSDP2's sharded gradients."""
FREED_GRADS = "unsharded grads freed"
"""The prefix of `Moment.parts` naming unsharded gradients FSDP2 has reduced (negative bytes)."""


@dataclass(frozen=True)
class Components:
    """A rank's bytes at the step's peak, by component (module docstring)."""

    parameters: int
    gradients: int
    optimizer_states: int
    fsdp_buffers: int
    saved_activations: int
    transient: int
    other: int

    @property
    def total(self) -> int:
        """Bytes: the sum of the components."""
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, int]:
        """Component name to bytes, in the order of the fields."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def window_names(blocks: int) -> list[tuple[str, tuple[str, ...]]]:
    """The windows of a step over `blocks` blocks in time order, each with its levels (the
    names `StepWindows.level` and FSDP2's moments use)."""
    names: list[tuple[str, tuple[str, ...]]] = [("root forward", ("start", "peak"))]
    for k in range(blocks):
        names.append((f"forward {k}", ("start", "peak")))
        if k < blocks - 1:
            names.append((f"between {k}", ("peak",)))
    names.append(("head", ("start", "peak")))
    names += [(f"backward {k}", ("start", "peak", "end")) for k in reversed(range(blocks))]
    names.append(("root backward", ("peak", "end")))
    return names


def plain_memory(
    parameters: int, optimizer_states: int, unsharded_grads: Sequence[int]
) -> FsdpMemory:
    """One process's step as the per-rank model `predict_peak` reads: `parameters` and
    `optimizer_states` resident (bytes), no FSDP buffers at any moment, and the gradients of
    each block, then the root's (`unsharded_grads`, bytes), which the windows hold."""
    blocks = len(unsharded_grads) - 1
    moments = tuple(
        Moment(window, level, 0, ()) for window, levels in window_names(blocks) for level in levels
    )
    return FsdpMemory(
        resident=parameters + optimizer_states,
        resident_parts={"sharded params": parameters, "optimizer state": optimizer_states},
        moments=moments,
        after=sum(unsharded_grads),
        unsharded_grads=tuple(unsharded_grads),
    )


def finished_grads(window: str, level: str, unsharded_grads: Sequence[int], head: int = 0) -> int:
    """Bytes of the unsharded gradients complete at `window`'s `level`: the head's (`head`
    bytes of the root's, those of parameters first used after the last block: complete once
    the blocks' backward starts), every block's whose backward has ended (a block's at its
    backward's "end"), the rest of the root's at the step's end."""
    blocks = len(unsharded_grads) - 1
    root = unsharded_grads[blocks]
    if window == "root backward":
        return sum(unsharded_grads[:blocks]) + (root if level == "end" else head)
    kind, _, index = window.partition(" ")
    if kind != "backward":
        return 0
    k = int(index)
    done = sum(unsharded_grads[k + 1 : blocks]) + head
    return done + (unsharded_grads[k] if level == "end" else 0)


def latest_peak(memory: FsdpMemory, windows: StepWindows) -> tuple[Moment, int]:
    """The last moment at which the rank holds its most bytes (`predict_peak`'s total, which
    names the first), and the activation bytes then. Where windows tie (a level not measured is
    bounded by its window's peak), the latest has the most gradients complete."""
    grads = sum(memory.unsharded_grads)
    best: tuple[int, Moment, int] | None = None
    for m in memory.moments:
        act = windows.level(m.window, m.level, grads)
        if best is None or act + m.fsdp_bytes >= best[0]:
            best = (act + m.fsdp_bytes, m, act)
    assert best is not None  # the root's moments are always there
    return best[1], best[2]


def _start_level(windows: StepWindows, window: str, grads: int) -> int:
    """Activation bytes live at `window`'s start: its first level; the head's, where the
    backward's start was not measured, the bytes live when the last block's output gradient
    is complete (what the forward left for the backward, and that gradient)."""
    if window == "head" and windows.backward_start is None:
        return min(windows.head, windows.b_start[-1])
    first = next(levels[0] for w, levels in window_names(len(windows.f_start)) if w == window)
    return windows.level(window, first, grads)


def peak_components(
    memory: FsdpMemory, windows: StepWindows, other: int = 0, head_grads: int = 0
) -> Components:
    """The components of the rank's bytes at the step's peak (module docstring); `other`:
    bytes outside the model (buffers, inputs) resident throughout; `head_grads`: bytes of the
    root's gradients of parameters first used after the last block (`finished_grads`)."""
    moment, activation = latest_peak(memory, windows)
    grads = sum(memory.unsharded_grads)
    sharded = sum(b for name, b in moment.parts if name.startswith(SHARDED_GRADS))
    reduced = sum(b for name, b in moment.parts if name.startswith(FREED_GRADS))  # <= 0
    window, level = moment.window, moment.level
    if window == "root backward" and windows.level(window, "end", grads) >= activation:
        level = "end"  # the root's backward peaks at the step's end: every gradient complete
    done = finished_grads(window, level, memory.unsharded_grads, head_grads)
    first = next(levels[0] for w, levels in window_names(len(windows.f_start)) if w == window)
    start_done = finished_grads(window, first, memory.unsharded_grads, head_grads)
    at_start = _start_level(windows, window, grads)
    saved = min(at_start - start_done, activation - done)
    return Components(
        parameters=memory.resident_parts["sharded params"],
        gradients=sharded + done + reduced,
        optimizer_states=memory.resident_parts["optimizer state"],
        fsdp_buffers=moment.fsdp_bytes - sharded - reduced,
        saved_activations=saved,
        transient=activation - done - saved,
        other=other,
    )
