"""A fit's answer counted only on captured graphs (`confirmed`): a size decided on the affine
prediction counts once its capture is the predicted graph."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from solver.deadline import Deadline
from solver.fitting.search import FitResult
from solver.fitting.sizes import DOES_NOT_FIT, FITS


class SizedSource(Protocol):
    """Where a search's graphs come from (`executor.fitting.graphs.SizedGraphs`): `captures`
    holds the sizes captured; with `affine`, the other sizes' graphs are predicted from them."""

    captures: Mapping[int, object]
    affine: bool

    def expected_seconds(self, size: int) -> float:
        """Seconds a capture at `size` is expected to take."""
        ...

    def refute(self, size: int) -> bool:
        """Capture `size`: whether the capture differs from the prediction."""
        ...


def confirmed(
    search: Callable[[], FitResult],
    graphs: SizedSource,
    dim: str,
    low: int,
    deadline: Deadline,
    notes: list[str],
) -> FitResult:
    """`search()`'s answer counting only probes decided on a captured graph.

    A probe decided on the affine prediction counts once its size is captured and the capture
    is the predicted graph (then its proof holds on it). The answer and its upper bound are
    captured where the deadline leaves time; where a capture refutes the prediction, `search()`
    runs again (over captures then) and its answer is taken. What was not captured is noted in
    `notes` (in `dim` units)."""
    found = search()
    captured = {p.size for p in found.probes if p.size in graphs.captures}
    for size in (found.size, found.upper):
        if not graphs.affine or size is None or size in captured:
            continue
        if not deadline.leaves(graphs.expected_seconds(size)):
            notes.append(
                f"{dim} {size} was decided on the affine prediction and not captured by the "
                "deadline: it is not counted"
            )
            continue
        if graphs.refute(size):  # the prediction is wrong there: no answer rests on it
            notes.append(
                f"the capture at {dim} {size} differs from the affine prediction: searched "
                "again over captures"
            )
            found = search()
            captured = {p.size for p in found.probes}
            break
        captured.add(size)
    probes = [p for p in found.probes if p.size in captured]
    size = max((p.size for p in probes if p.verdict == FITS), default=None)
    upper = min(
        (p.size for p in probes if p.verdict == DOES_NOT_FIT and p.size > (size or 0)), default=None
    )
    proven = upper is not None and upper == (low if size is None else size + 1)
    schedule = None if size is None else next(p.schedule for p in probes if p.size == size)
    return FitResult(size, upper, proven, schedule, found.probes, found.seconds)
