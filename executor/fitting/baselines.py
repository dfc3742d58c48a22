"""The real steps of a fit and what it is compared with, each within the fit's deadline.

    run_step       one real step at the size found under remat's executor: the measured
                   whole-step peak
    eager          the largest size eager trains in, measured by bisection, with the measured
                   peak at its size + 1
    per_block      per-block checkpointing's largest size within the compute cap, predicted

Each piece of work starts only where the time left holds it, as `expected_seconds` predicts
from the same work at other sizes (captures, and eager steps: building the model and one step);
a bisection cut short by the deadline says so (`complete` False).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import solver
from executor.fitting.graphs import SizedGraphs, build, expected_seconds
from executor.fitting.memory import TrainingStep
from executor.traced.module import Rematerialized
from solver.deadline import Deadline
from solver.fitting.per_block import per_block_peak
from solver.fitting.sizes import DOES_NOT_FIT, FITS, largest_between
from solver.fitting.static import StaticBytes


class EagerSteps:
    """Eager training steps at any size, with the wall time each took (build and one step)."""

    def __init__(self, graphs: SizedGraphs, optimizer: str) -> None:
        self.graphs, self.optimizer = graphs, optimizer
        self.seconds: dict[int, float] = {}

    def prepare(self, size: int) -> tuple[TrainingStep, StaticBytes]:
        """A fresh model at `size`, one eager step run: the step and what exists before the
        next."""
        started = time.perf_counter()
        step = TrainingStep(*build(self.graphs.factory, size, self.graphs.dim), self.optimizer)
        static = step.prepare()
        self.seconds[size] = time.perf_counter() - started
        return step, static

    def expected_seconds(self) -> float:
        """Seconds two steps (one to prepare, one measured) are expected to take."""
        return 2 * expected_seconds(self.seconds)


def run_step(
    steps: EagerSteps, size: int, schedule: solver.Schedule | None
) -> tuple[int, int | None]:
    """One real training step at `size` under `schedule` (remat's executor, on the captured
    model): its measured whole-step peak in bytes, and the bytes its host copies held at most
    (`Rematerialized.host_pool`; None for a schedule without a link)."""
    model, inputs, kwargs = steps.graphs.capture(size).made
    rm = Rematerialized(model, steps.graphs.capture(size).graph, schedule)
    step = TrainingStep(model, inputs, kwargs, steps.optimizer, forward=rm)
    step.prepare()
    pool = rm.host_pool
    if pool is not None:
        pool.reset_peak()
    return step.measured_peak(), None if pool is None else pool.host_peak


@dataclass
class Eager:
    """Eager's bisection: `size` the largest size measured within the memory (None: none in
    range), `peak` its measured whole-step peak, `over` the measured peak at size + 1 (None:
    not run), `complete` whether the bisection closed (else larger sizes may fit)."""

    size: int | None
    peak: int | None
    over: int | None
    complete: bool


def eager(steps: EagerSteps, memory: int, low: int, high: int, deadline: Deadline) -> Eager:
    """The largest size in [`low`, `high`] whose eager step measures within `memory` bytes
    (bisection over measured steps, `high` first), each step started only where the deadline
    leaves it time."""
    measured: dict[int, int] = {}

    def peak(size: int) -> int | None:
        if size not in measured:
            if not deadline.leaves(steps.expected_seconds()):
                return None
            step, _ = steps.prepare(size)
            measured[size] = step.measured_peak()
        return measured[size]

    def decide(size: int) -> str | None:
        at = peak(size)
        return None if at is None else FITS if at <= memory else DOES_NOT_FIT

    at_high = peak(high)
    if at_high is not None and at_high <= memory:
        return Eager(high, at_high, None, False)
    if at_high is None:
        return Eager(None, None, None, False)
    fits, _, complete = largest_between(decide, low - 1, high)
    size = fits if fits >= low else None
    return Eager(size, measured.get(fits), measured.get(fits + 1), complete)


def per_block(
    graphs: SizedGraphs,
    left: Callable[[int], int],
    cap: str | None,
    low: int,
    high: int,
    deadline: Deadline,
) -> tuple[int | None, bool]:
    """The largest size in [`low`, `high`] whose per-block checkpointing (every module block at
    the depth of least peak among those within the compute cap, `block_checkpoint`) peaks
    within the bytes left to the step (bisection: the peak never falls as the size grows, NOTE
    [monotone sizes]), and whether the bisection closed by the deadline."""

    def decide(size: int) -> str | None:
        needs = 0.0 if graphs.affine else graphs.expected_seconds(size)  # a capture
        if not deadline.leaves(needs):
            return None
        peak = per_block_peak(graphs(size), cap)
        return FITS if peak is not None and peak <= left(size) else DOES_NOT_FIT

    fits, _, complete = largest_between(decide, low - 1, high + 1)
    return (fits if fits >= low else None), complete
