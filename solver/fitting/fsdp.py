"""What a fit counts per rank under FSDP2 (`fit(..., world_size=N)`): torch-free, bytes.

Per rank, before the step: the FSDP model's resident bytes (`solver.target.fsdp`: the sharded
parameters and the optimizer state; `.grad` None, as after `zero_grad(set_to_none=True)`), the
buffers and the inputs. The step: the schedule's peak (the single-process graph on one rank's
batch, whose parameter gradients are freed after their last use), plus every unsharded
gradient (autograd keeps them as `.grad` until FSDP reduces them), plus the most FSDP bytes of
any moment (`FsdpMemory.max_fsdp_bytes`: gathered parameters, reduce-scatter buffers, sharded
gradients, less the unsharded gradients freed by then). The step's budget is what
`activation_budget` leaves of the memory less those gradients; after the backward, the sharded
gradients and the optimizer step's temporaries must fit beside what exists before the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.fitting.static import StaticBytes
from solver.target import FsdpMemory, Moment, activation_budget


@dataclass(frozen=True)
class FsdpBytes:
    """One rank's FSDP2 bytes for a fit: `memory` is `fsdp_memory`'s answer for the model's
    groups (`blocks` of them, and the root) over `world_size` ranks."""

    world_size: int
    blocks: int
    memory: FsdpMemory

    @property
    def moment(self) -> Moment:
        """The moment with the most FSDP bytes (the first of equals), the one the budget
        counts."""
        return max(self.memory.moments, key=lambda m: m.fsdp_bytes)

    @property
    def unsharded_grads(self) -> int:
        return sum(self.memory.unsharded_grads)

    def static(self, buffers: int, inputs: int) -> StaticBytes:
        """What exists on a rank before the step: the sharded parameters, the optimizer state
        (no `.grad`), the buffers (not sharded) and one rank's inputs."""
        parts = self.memory.resident_parts
        return StaticBytes(
            parameters=parts["sharded params"],
            gradients=0,
            optimizer_state=self.memory.resident - parts["sharded params"],
            buffers=buffers,
            inputs=inputs,
        )

    def step_budget(self, room: int) -> int:
        """The schedule's byte budget where `room` bytes are left after what exists before the
        step (-1 where the sharded gradients and the optimizer step's temporaries do not fit
        in `room`: nothing fits then)."""
        if room < self.memory.after + self.memory.optimizer_temporaries:
            return -1
        return activation_budget(self.memory, room + self.memory.resident) - self.unsharded_grads

    def line(self) -> str:
        """The per-rank bytes, for `Fit.summary`."""
        parts = self.memory.resident_parts
        m = self.moment
        return (
            f"per rank under FSDP2 ({self.world_size} ranks, {self.blocks} blocks and the root "
            f"sharded): resident {self.memory.resident} B (sharded parameters "
            f"{parts['sharded params']} B, optimizer state {parts['optimizer state']} B; .grad "
            f"None before the step); FSDP moment counted: {m.window}, {m.level}, "
            f"{m.fsdp_bytes} B (the most of any moment), plus the unsharded gradients "
            f"{self.unsharded_grads} B; after the backward: sharded gradients "
            f"{self.memory.after} B"
        )
