"""A step's per-rank peak under FSDP2: the single-process step's activation windows
(`StepWindows`) met with `solver.target.fsdp`'s moments (`predict_peak`), and its inverse, the
activation bytes a rank's memory allows (`activation_budgets`, `activation_budget`).
Torch-free; bytes throughout (docs/fsdp.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.errors import ArgumentError
from solver.target.fsdp import FsdpMemory, Moment


@dataclass(frozen=True)
class StepWindows:
    """The single-process step's live bytes (one rank's batch, parameters in the param dtype,
    every `.grad` None at its start), above the bytes live before it, cut where FSDP acts.

    Per block k in forward order: `f_start[k]`, `f_peak[k]` (live at its forward's start, the
    most inside it), `b_start[k]`, `b_peak[k]` (live when its output's gradient is complete,
    the most from then to the previous block's `b_start`; block 0's to `root_b_start`, or to
    the step's end). `before`: the most before block 0's forward; `between[k]`: the most from
    block k's forward end to block k+1's start; `head`: the most from the last block's forward
    end to its backward's start (the root's forward tail, the loss, the head's backward).
    Optional (None: bounded by a window's peak): `backward_start`, live when the backward
    starts, the loss computed (None: `head`); `root_b_start`, `root_b_peak`, live when block
    0's backward ends (its input's gradient complete) and the most from then to the step's
    end (None: `b_peak[0]`); `end`, live at the step's end (None: its gradients,
    `sum(FsdpMemory.unsharded_grads)`). `executor.sac.recording.windows.measure_windows` measures
    the windows (`from_segments`); run with the module before block 0 (GPT-2's `transformer.drop`)
    as a leading block, it also cuts block 0's backward at `root_b_start`.
    """

    f_start: tuple[int, ...]
    f_peak: tuple[int, ...]
    b_start: tuple[int, ...]
    b_peak: tuple[int, ...]
    before: int
    between: tuple[int, ...]
    head: int
    backward_start: int | None = None
    root_b_start: int | None = None
    root_b_peak: int | None = None
    end: int | None = None

    def __post_init__(self) -> None:
        n = len(self.f_start)
        sizes = (len(self.f_peak), len(self.b_start), len(self.b_peak), len(self.between) + 1)
        if any(m != n for m in sizes) or n == 0:
            raise ArgumentError(f"StepWindows: per-block lists of unequal length {n}, {sizes}")

    @classmethod
    def from_segments(
        cls,
        f_start: Sequence[int],
        f_peak: Sequence[int],
        b_start: Sequence[int],
        b_peak: Sequence[int],
        segments: Sequence,
        backward_start: int | None = None,
        end: int | None = None,
    ) -> StepWindows:
        """From the blocks' windows and the stretches between them as `solver.sac.Segment`s
        (`peak`, `held`: held 0 before block 0, held k+1 after block k's forward)."""
        peaks = {s.held: s.peak for s in segments}
        n = len(f_start)
        return cls(
            tuple(f_start),
            tuple(f_peak),
            tuple(b_start),
            tuple(b_peak),
            before=peaks[0],
            between=tuple(peaks[k + 1] for k in range(n - 1)),
            head=peaks[n],
            backward_start=backward_start,
            end=end,
        )

    def level(self, window: str, level: str, grads: int) -> int:
        """Activation bytes of the window at `level` ("start", "peak", "end"); `grads`: the
        step's gradients, its end where `end` is None. A level not measured is bounded by the
        window's peak (block 0's backward end: `b_peak[0]`)."""
        kind, _, index = window.partition(" ")
        if kind == "root":
            if index == "forward":
                return 0 if level == "start" else self.before
            peak = level == "peak"
            return _or(self.root_b_peak, self.b_peak[0]) if peak else _or(self.end, grads)
        if kind == "head":
            return _or(self.backward_start, self.head) if level == "start" else self.head
        if kind == "between":
            return self.between[int(index)]
        k = int(index)
        if kind == "forward":
            return self.f_start[k] if level == "start" else self.f_peak[k]
        if level == "start":
            return self.b_start[k]
        if level == "end":
            return self.b_start[k - 1] if k > 0 else _or(self.root_b_start, self.b_peak[0])
        return self.b_peak[k]


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


@dataclass(frozen=True)
class RankPeak:
    """A predicted per-rank peak. `peak`: bytes live on the rank at the step's peak
    (`resident` + `step_peak`); `step_peak`: above the bytes before the step; at the moment of
    `window` and `level` where `activation` and `fsdp` bytes meet; `windows`: each window's
    most, above the bytes before the step."""

    peak: int
    step_peak: int
    resident: int
    window: str
    level: str
    activation: int
    fsdp: int
    windows: dict[str, int]


def predict_peak(memory: FsdpMemory, windows: StepWindows) -> RankPeak:
    """The per-rank peak of the step whose single-process windows are `windows`, sharded as
    `memory` says: per moment, its window's activation bytes at its level plus its FSDP bytes;
    the peak is the most (bytes)."""
    grads = sum(memory.unsharded_grads)
    best: tuple[int, Moment, int] | None = None
    per_window: dict[str, int] = {}
    for m in memory.moments:
        act = windows.level(m.window, m.level, grads)
        total = act + m.fsdp_bytes
        per_window[m.window] = max(per_window.get(m.window, total), total)
        if best is None or total > best[0]:
            best = (total, m, act)
    assert best is not None  # the root's moments are always there
    total, m, act = best
    return RankPeak(
        peak=memory.resident + total,
        step_peak=total,
        resident=memory.resident,
        window=m.window,
        level=m.level,
        activation=act,
        fsdp=m.fsdp_bytes,
        windows=per_window,
    )


def activation_budgets(memory: FsdpMemory, usable: int) -> dict[str, int]:
    """Per window, the most activation bytes of the single-process step (above its start, at
    any level of that window) the rank's `usable` bytes allow: the bytes PyTorch may allocate
    on the rank (`Device.usable`: the device's capacity less the process's memory outside
    PyTorch, not nvidia-smi's memory) less the resident bytes and the window's most FSDP
    bytes. Negative where even no activation fits."""
    free = usable - memory.resident
    return {m.window: free - memory.max_fsdp_bytes(m.window) for m in memory.moments}


def activation_budget(memory: FsdpMemory, usable: int) -> int:
    """One budget for the single-process step's peak (bytes above its start) that keeps every
    window within `usable` bytes (`activation_budgets`): the least of `activation_budgets`
    (every window's levels are at most the step's peak)."""
    return min(activation_budgets(memory, usable).values())
