"""Exact replay of random ops: every compute of a random node draws what eager drew.

Eager draws random numbers in program order: random node k starts from the generator state
that random nodes 0..k-1 left behind. A schedule may compute random nodes out of that order and
recompute them later, so `RngReplay` keeps, per step:

- `states[k]`: the generator state right before random node k's draw (recorded once per step);
- `cursor`: how many random nodes have drawn *fresh* from the live generator, in eager order.

A first draw of node k that is next in eager order just records the state and draws (no cost but
one state copy). A first draw of a node further ahead first *dry-runs* the skipped nodes (their
op on zero inputs of the recorded shape, result dropped) so the live generator advances exactly as
eager's did; every later draw (recompute, or a node that was dry-run) restores `states[k]`, draws,
and puts the live state back. After `finish()` the live generator is where eager left it, so the
next training step draws fresh numbers exactly like eager's next step (no stale masks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from graph_capture.measurement.device import generator

__all__ = ["RngReplay"]


class RngReplay:
    """Per-step record of generator states for the random nodes of one graph.

    `order`: the random nodes' slots in eager (program) order. `devices[i]`: the device whose
    default generator node `order[i]` draws from. `dry_runs[i]`: a zero-argument callable that
    performs node `order[i]`'s draw on placeholder inputs (used only for out-of-order first draws).
    """

    def __init__(
        self,
        order: Sequence[int],
        devices: Sequence[torch.device],
        dry_runs: Sequence[Callable[[], object]],
    ) -> None:
        self._position = {slot: i for i, slot in enumerate(order)}
        self._generators = [generator(d) for d in devices]
        self._dry_runs = dry_runs
        self._states: list[torch.Tensor | None] = [None] * len(order)
        self._cursor = 0

    def draw(self, slot: int, run: Callable[[], object]) -> object:
        """Run random node `slot`'s op (`run()`) with the generator state eager had for it."""
        k = self._position[slot]
        if k >= self._cursor:
            self._advance_to(k)
            self._states[k] = self._generators[k].get_state()
            self._cursor = k + 1
            return run()
        generator = self._generators[k]
        live = generator.get_state()
        generator.set_state(self._states[k])
        try:
            return run()
        finally:
            generator.set_state(live)

    def finish(self) -> None:
        """Advance the live generator past every random node not drawn yet (end of forward)."""
        self._advance_to(len(self._states))

    def _advance_to(self, k: int) -> None:
        while self._cursor < k:
            i = self._cursor
            self._states[i] = self._generators[i].get_state()
            self._dry_runs[i]()
            self._cursor = i + 1
