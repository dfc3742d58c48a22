"""A step's memory windows around blocks and their children, cut from its allocation events at
the marks its module hooks made: live bytes at each block's forward and backward start, the peak
of each stretch between marks (`cut_windows`). Torch-free: `executor.sac.recording.windows` records
the events and marks (the profiler's allocation events, or a fake step's storages)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from solver.errors import RematError
from solver.sac.problem import Segment


class WindowError(RematError, ValueError):
    """The marks do not show each block's forward once per step, in order and not nested."""


@dataclass(frozen=True)
class Windows:
    """Per block j: live bytes where its forward starts (`f_start`), the peak from there to the
    next mark (`f_peak`), the same for its backward (`b_start`, `b_peak`); the stretches outside
    blocks (`segments`), the step's `peak`; per block whose children ran once each in sequence,
    their windows (`splits[j]`) and the block's stretches outside them (`inner[j]`), else
    None; `backward_start`: live bytes when the backward starts, the loss computed;
    `root_b_start`, `root_b_peak`: live when block 0's inputs' gradients are complete and the
    most from then to the step's end (the root's own backward); `end`: live at the step's end
    (None: not measured; the root's None where block 0's inputs need no gradient). Bytes.
    `largest`: per window (`solver.target.components.window_names`' names) whose allocations
    the measurer names, the largest made in it and live at its peak (`largest_at_peaks`)."""

    f_start: list[int]
    f_peak: list[int]
    b_start: list[int]
    b_peak: list[int]
    segments: list[Segment]
    peak: int
    splits: list[list[tuple[int, int, int, int]] | None] = field(default_factory=list)
    inner: list[list[Segment] | None] = field(default_factory=list)
    backward_start: int | None = None
    root_b_start: int | None = None
    root_b_peak: int | None = None
    end: int | None = None
    largest: tuple[tuple[str, str, int], ...] = ()


class Allocation(NamedTuple):
    """One allocation of a step: made at `start`, freed at `end` (None: live at the step's
    end), `nbytes` bytes, `what` it is in words (the op and its output's shape and dtype)."""

    start: int
    end: int | None
    nbytes: int
    what: str


def largest_at_peaks(
    allocations: Sequence[Allocation], stretches: Sequence[tuple[str, int, int | None]]
) -> tuple[tuple[str, str, int], ...]:
    """Per stretch (name, start time, end time or None: the step's end), the largest
    allocation made in it and live at its peak, as (name, what, bytes); a stretch whose
    allocations are all freed before its peak, or that makes none, is left out. The peak is
    the first moment of the stretch holding the most bytes of `allocations` (every one of
    them counted, made in the stretch or before)."""
    events = sorted(
        [(a.start, a.nbytes) for a in allocations]
        + [(a.end, -a.nbytes) for a in allocations if a.end is not None]
    )
    by_start = sorted(allocations)
    starts = [a.start for a in by_start]
    out = []
    live, k = 0, 0
    for name, begin, end in stretches:
        while k < len(events) and events[k][0] < begin:
            live += events[k][1]
            k += 1
        best, at = live, begin
        while k < len(events) and (end is None or events[k][0] < end):
            live += events[k][1]
            if live > best:
                best, at = live, events[k][0]
            k += 1
        made = by_start[bisect.bisect_left(starts, begin) : bisect.bisect_right(starts, at)]
        held = [a for a in made if a.end is None or a.end > at]
        if held:
            top = max(held, key=lambda a: a.nbytes)
            out.append((name, top.what, top.nbytes))
    return tuple(out)


def _labels(j: int, children: int | None) -> tuple[list[str], list[str]]:
    """Block j's marks in forward and backward order, its children's (if any) nested."""
    kids = range(children or 0)
    forward = [f"fs{j}", *(f"{k}{j}.{c}" for c in kids for k in ("fs", "fe")), f"fe{j}"]
    return forward, [f"bs{j}", *(f"bs{j}.{c}" for c in reversed(kids))]


def _canonical(counts: Sequence[int | None]) -> list[str]:
    forward: list[str] = []
    backward: list[str] = []
    for j, n in enumerate(counts):
        f, b = _labels(j, n)
        forward += f
        backward = b + backward
    return forward + backward


def cut_windows(
    times: list[int],
    events: list[tuple[int, int]],
    marks: list[str],
    counts: list[int | None],
    until: int | None = None,
) -> Windows:
    """Live bytes at each mark and the peak of each stretch between consecutive marks: the
    blocks' windows, and where a block's children ran in sequence, theirs. `times`: each
    mark's time, in the order of `marks`; `events`: (time, bytes) allocated (+) and freed (-),
    in time order; `until`: where block 0's backward ends (the last stretch stops there; the
    step's `peak` still counts what follows), None: the step's end."""
    timed = sorted(zip(times, marks, strict=True))
    times = [t for t, _ in timed]
    n = len(counts)
    blocks_only = _canonical([None] * n)
    observed = _untie([label for _, label in timed], times, events, _canonical(counts))
    for j, count in enumerate(counts):
        if count is None:
            continue
        own = {x for part in _labels(j, count) for x in part}
        if [x for x in observed if x in own] != [x for x in _canonical(counts) if x in own]:
            counts[j] = None  # its children do not run once each, in sequence
    keep = set(_canonical(counts))
    kept = [(t, x) for t, x in zip(times, observed, strict=True) if x in keep]
    if [x for _, x in kept] != _canonical(counts):
        counts = [None] * n
        kept = [(t, x) for t, x in zip(times, observed, strict=True) if x in blocks_only]
    if [x for _, x in kept if x in blocks_only] != blocks_only:
        raise WindowError(
            "each block must run its forward once per step, in order and not nested, and "
            f"return a tensor that requires grad; the step ran {[x for _, x in timed]}"
        )
    coarse = [(t, x) for t, x in kept if x in blocks_only]
    starts, first, after = _stretches(events, [t for t, _ in coarse], until)
    at = {label: m for m, (_, label) in enumerate(coarse)}
    segments = [Segment(first, 0)]
    segments += [Segment(after[at[f"fe{j}"]], j + 1) for j in range(n)]
    fine_starts, _, fine_after = _stretches(events, [t for t, _ in kept], until)
    fat = {label: m for m, (_, label) in enumerate(kept)}
    splits: list[list[tuple[int, int, int, int]] | None] = []
    inner: list[list[Segment] | None] = []
    for j, count in enumerate(counts):
        if count is None:
            splits.append(None)
            inner.append(None)
            continue
        splits.append(
            [
                tuple(
                    v[fat[f"{k}{j}.{c}"]]
                    for k, v in (
                        ("fs", fine_starts),
                        ("fs", fine_after),
                        ("bs", fine_starts),
                        ("bs", fine_after),
                    )
                )
                for c in range(count)
            ]
        )
        inner.append(
            [Segment(fine_after[fat[f"fs{j}"]], 0)]
            + [Segment(fine_after[fat[f"fe{j}.{c}"]], c + 1) for c in range(count)]
            + [Segment(fine_after[fat[f"bs{j}"]], count)]
        )
    return Windows(
        f_start=[starts[at[f"fs{j}"]] for j in range(n)],
        f_peak=[after[at[f"fs{j}"]] for j in range(n)],
        b_start=[starts[at[f"bs{j}"]] for j in range(n)],
        b_peak=[after[at[f"bs{j}"]] for j in range(n)],
        segments=segments,
        peak=max([first, *after, 0 if until is None else peak_after(events, until)]),
        splits=splits,
        inner=inner,
    )


def _untie(
    labels: list[str], times: list[int], events: list[tuple[int, int]], canonical: list[str]
) -> list[str]:
    """The marks in time order, with adjacent marks put in canonical order where no allocation
    event lies between them (hooks firing together, such as a block's and its last child's on
    one output tensor, run in registration order, not nesting order)."""
    rank = {label: k for k, label in enumerate(canonical)}
    stamps = [t for t, _ in events]
    labels = list(labels)
    changed = True
    while changed:
        changed = False
        for i in range(len(labels) - 1):
            a, b = rank.get(labels[i], -1), rank.get(labels[i + 1], -1)
            if a > b >= 0 and bisect.bisect_left(stamps, times[i]) == bisect.bisect_right(
                stamps, times[i + 1]
            ):
                labels[i], labels[i + 1] = labels[i + 1], labels[i]
                changed = True
    return labels


def live_at(events: list[tuple[int, int]], time: int) -> int:
    """Live bytes at `time` (events stamped with it counted) of `events` (time, +/- bytes)."""
    return sum(size for t, size in events if t <= time)


def peak_after(events: list[tuple[int, int]], time: int) -> int:
    """The most bytes live from `time` (`live_at`) to the end of `events`."""
    live = best = live_at(events, time)
    for t, size in events:
        if t > time:
            live += size
            best = max(best, live)
    return best


def _stretches(
    events: list[tuple[int, int]], times: list[int], until: int | None = None
) -> tuple[list[int], int, list[int]]:
    """Live bytes at each mark time, the peak before the first, and the peak of the stretch
    from each mark to the next (the last: to `until`, or the end). An event stamped with a
    mark's own time may fall on either side: it counts on both."""
    live = peak = 0
    starts: list[int] = []
    peaks: list[int] = []  # peak of the stretch before each mark
    k = 0
    for t in times:
        while k < len(events) and events[k][0] < t:
            live += events[k][1]
            peak = max(peak, live)
            k += 1
        before = live
        while k < len(events) and events[k][0] == t:
            live += events[k][1]
            peak = max(peak, live)
            k += 1
        peaks.append(peak)
        starts.append(max(before, live))
        peak = max(before, live)
    for t, size in events[k:]:
        if until is not None and t > until:
            break
        live += size
        peak = max(peak, live)
    peaks.append(peak)
    return starts, peaks[0], peaks[1:]
