"""What recording a training step needs: the step, the tensors in a value, a snapshot of the
state a run changes (RNG, buffers), so that recording leaves no trace, the order the step calls
modules in, and the time it may take (`RecordingTime`)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.hooks import RemovableHandle

from executor.errors import PlanError
from graph_capture.measurement.peak import Snapshot
from solver.deadline import NEVER, Deadline
from solver.errors import SolverTimeoutError
from solver.time_shares import SAC_SHARES, SacShares

__all__ = ["LossClosure", "RecordingTime", "Snapshot", "hooked", "in_call_order", "leaf_tensors"]

LossClosure = Callable[[], torch.Tensor]
"""The forward of one training step as a closure of no arguments: returns the scalar loss (as
`torch.optim.Optimizer.step`'s ``closure`` does)."""


def leaf_tensors(tree: object) -> list[torch.Tensor]:
    """The tensors among the leaves of a pytree (args, kwargs, outputs)."""
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


@contextlib.contextmanager
def hooked(handles: Iterable[RemovableHandle]) -> Iterator[None]:
    """A block in which the hooks of `handles` stay registered; they are removed after it."""
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class RecordingTime:
    """The time a recording may take, in plain steps and seconds (`time.perf_counter()`).

    `deadline` ends the whole call (`time_limit` seconds from its start); `spare` is when the
    recording stops repeating measurements, leaving the rest to the solve; `shares` says how
    the call's seconds are shared out (`SacShares`: `spare` is its `recording`). A measurement's
    first run is taken whatever the time (`repeats`); `finished` notes each part recorded,
    with its weight in plain steps at one run per measurement of the `total` the recording
    makes, and raises `PlanError` once `deadline` has passed (or its stop was requested: the
    first Ctrl-C), naming what was recorded and about how long the whole recording needs."""

    time_limit: float = float("inf")
    deadline: Deadline = NEVER
    spare: Deadline = NEVER
    total: float = 1.0
    began: float = field(default_factory=time.perf_counter)
    done: list[str] = field(default_factory=list)
    steps: float = 0.0
    shares: SacShares = SAC_SHARES

    def repeats(self, most: int, until: Deadline | None = None) -> Iterator[int]:
        """0, 1, ... below `most`: the first always, each further one while `until` (default
        `spare`) leaves time for as long as the longest run so far took."""
        longest = 0.0
        for k in range(most):
            if k and not (until or self.spare).leaves(longest):
                return
            start = time.perf_counter()
            yield k
            longest = max(longest, time.perf_counter() - start)

    def finished(self, what: str, steps: float) -> None:
        """Note `what` as recorded (`steps` plain steps' worth); PlanError if time is out."""
        self.done.append(what)
        self.steps += steps
        if not self.deadline.passed():
            return
        elapsed = time.perf_counter() - self.began
        need = elapsed * self.total / self.steps
        if self.deadline.stopped():
            raise PlanError(
                f"checkpoint_plan was interrupted while recording ({elapsed:.1f} s: "
                f"{', '.join(self.done)}): no plan before the recording is done"
            )
        raise PlanError(
            f"checkpoint_plan ran out of time_limit={self.time_limit:g} s while recording: in "
            f"{elapsed:.1f} s it recorded {', '.join(self.done)}, and the whole recording, each "
            f"measurement run once, needs about {need:.0f} s, the solve more: give "
            f"time_limit={max(2 * need, self.time_limit + 1):.0f} or more"
        )

    @contextlib.contextmanager
    def solving(self) -> Iterator[None]:
        """The solve after the recording: where it finds no plan before `deadline`
        (`SolverTimeoutError`, not a stop), the error says how long the recording took and
        what time_limit to give."""
        recorded = time.perf_counter() - self.began
        try:
            yield
        except SolverTimeoutError as error:
            if self.deadline.stopped() or math.isinf(self.time_limit):
                raise
            raise SolverTimeoutError(
                f"checkpoint_plan found no plan within time_limit={self.time_limit:g} s: the "
                f"recording took {recorded:.1f} s and the solve found none in what was left; "
                f"give time_limit={math.ceil(max(2 * recorded, self.time_limit + 1))} or more",
                error.cost_bound,
            ) from error


def in_call_order(
    model: nn.Module, named: Sequence[tuple[str, nn.Module]], step: LossClosure
) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs in the order a forward (without grad) first calls them; those
    it never calls are left out."""
    first: dict[int, int] = {}

    def called(k: int) -> None:  # a pre-hook returning a value would replace the inputs
        first.setdefault(k, len(first))

    handles = [
        m.register_forward_pre_hook(lambda _m, _a, k=k: called(k)) for k, (_, m) in enumerate(named)
    ]
    snapshot = Snapshot(model)
    try:
        with hooked(handles), torch.no_grad():
            step()
    finally:
        snapshot.restore()
    return [named[k] for k in sorted(first, key=first.__getitem__)]
