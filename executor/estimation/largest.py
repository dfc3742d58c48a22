"""The largest sizes at which each strategy's step fits (`largest_sizes`): per dimension (a
factory building the model and inputs at any size, as `executor.fit`'s), one estimate per
size, shared by every row; `solver.fitting.sizes.largest_size` searches each row's sizes, its
guess the size where the row's total, affine in the size through sizes 1 and 2, meets the
usable memory.

A size fits a row where the row's bytes per rank are within the usable memory; it does not
where they are above it (a fixed policy), or where remat's solve proves that no plan fits
(`InfeasibleBudgetError`); it stays open where the solve found no plan in its time. A row's
largest size is proven where the size above it was estimated and does not fit. The search ends
short where no time is left or the model fails at a size (a position table it outgrows, a
tensor too large to address): the row's `Largest.note` says which."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from executor.errors import PlanError
from executor.estimation.report import Largest, StepEstimate, StrategyEstimate
from graph_capture.models.factories import unpack_model
from solver.deadline import Deadline
from solver.errors import InternalError
from solver.fitting.sizes import DOES_NOT_FIT, FITS, OPEN, largest_size

MOST = 1 << 20
"""The largest size searched (in the factory's units)."""

EstimateAt = Callable[[object, Deadline], StepEstimate]
"""One estimate of a factory's output (``(model, example_inputs[, example_kwargs])``) by a
deadline (within the time one size may take)."""


@dataclass
class _Sizes:
    """The estimates of one dimension's sizes, each made once (None: no time left for it, or
    the model failed at that size: `stop` says which)."""

    dim: str
    factory: Callable[[int], object]
    estimate_at: EstimateAt
    deadline: Deadline
    seen: dict[int, StepEstimate | None] = field(default_factory=dict)
    stop: str = ""  # why a size has no estimate
    longest: float = 0.0  # seconds of the longest estimate so far

    def at(self, size: int) -> StepEstimate | None:
        if size not in self.seen:
            self.seen[size] = self._estimate(size)
        return self.seen[size]

    def _estimate(self, size: int) -> StepEstimate | None:
        if not self.deadline.leaves(self.longest):
            left = self.deadline.remaining()
            self.stop = (
                f"{left:.0f} s left, and a size's estimate took up to {self.longest:.0f} s: "
                f"{self.dim} {size:,} not estimated; give more time_limit"
            )
            return None
        try:
            made = unpack_model(self.factory(size))
        except Exception as error:  # the user's code: any failure is reported with its size
            raise PlanError(
                f"the {self.dim} factory failed at size {size}: {type(error).__name__}: {error}"
            ) from error
        start = time.perf_counter()
        try:
            return self.estimate_at(made, self.deadline)
        except InternalError:
            raise
        except Exception as error:  # the model at this size, or its time: ends the search
            self.stop = f"{self.dim} {size:,} failed: {type(error).__name__}: {error}"
            return None
        finally:
            self.longest = max(self.longest, time.perf_counter() - start)


def verdict(row: StrategyEstimate, usable: int) -> str:
    """Whether `row`'s step fits `usable` bytes per rank (module docstring)."""
    if row.total is not None:
        return FITS if row.total <= usable else DOES_NOT_FIT
    return DOES_NOT_FIT if row.status == "INFEASIBLE" else OPEN


def _guess(sizes: _Sizes, name: str, usable: int) -> int | None:
    """The size at which `name`'s total, affine through sizes 1 and 2, is the most within
    `usable` (None: a total missing, or not growing with the size)."""
    one, two = sizes.at(1), sizes.at(2)
    if one is None or two is None:
        return None
    a, b = one.strategy(name).total, two.strategy(name).total
    if a is None or b is None or b <= a:
        return None
    return 1 + (usable - a) // (b - a)


def _largest(sizes: _Sizes, name: str, usable: int) -> Largest:
    """Row `name`'s largest size along `sizes`' dimension."""

    def decide(size: int) -> str | None:
        at = sizes.at(size)
        return None if at is None else verdict(at.strategy(name), usable)

    search = largest_size(decide, lambda: _guess(sizes, name, usable), MOST)
    note = "" if search.closed else sizes.stop or _left_open(sizes, name, search.fits)
    above = None if search.fails is None else sizes.seen.get(search.fails)
    if above is None:
        return Largest(search.fits, search.closed, search.fails, note)
    row = above.strategy(name)
    limit = f"{row.peak_at}: {row.bottleneck}" if row.bottleneck else ""
    return Largest(search.fits, search.closed, search.fails, note, limit, row.bottleneck_bytes)


def _left_open(sizes: _Sizes, name: str, fits: int) -> str:
    """Why the least size above `fits` that `name`'s row leaves open is open ("": none)."""
    for size in sorted(n for n, at in sizes.seen.items() if at is not None and n > fits):
        row = sizes.seen[size].strategy(name)
        if verdict(row, sizes.seen[size].usable) == OPEN:
            return f"{sizes.dim} {size:,} left open: {row.status}: {row.note}"
    return ""


def largest_sizes(
    factories: Mapping[str, Callable[[int], object]],
    estimate: StepEstimate,
    estimate_at: EstimateAt,
    deadline: Deadline,
) -> dict[str, dict[str, Largest]]:
    """Per dimension of `factories`, per row of `estimate` that is predicted, the largest size
    whose step fits `estimate.usable` (module docstring); each size estimated by
    `estimate_at(made, deadline)`; a size is not started where the time left is less than the
    longest estimate so far."""
    out: dict[str, dict[str, Largest]] = {}
    for dim, factory in factories.items():
        sizes = _Sizes(dim, factory, estimate_at, deadline)
        rows = [r.name for r in estimate.strategies if r.status != "NOT PREDICTED"]
        out[dim] = {name: _largest(sizes, name, estimate.usable) for name in rows}
    return out
