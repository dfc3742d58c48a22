"""What exists before a training step (`StaticBytes`, bytes by part) and the bytes before a step
at any size (`affine_static`): torch-free. Sizes are in the fitted dimension's units."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from solver.errors import RematError
from solver.fitting.sizes import affine


class StaticBytesError(RematError, ValueError):
    """The bytes before a step are not the model's plus inputs affine in the size."""


@dataclass(frozen=True)
class StaticBytes:
    """Bytes that exist before a training step, by part (unique storages)."""

    parameters: int
    gradients: int
    optimizer_state: int
    buffers: int
    inputs: int

    @property
    def model(self) -> int:
        """Parameters, gradients, optimizer state and buffers: what does not depend on the
        inputs."""
        return self.parameters + self.gradients + self.optimizer_state + self.buffers

    @property
    def total(self) -> int:
        return self.model + self.inputs


def affine_static(statics: dict[int, StaticBytes]) -> Callable[[int], StaticBytes]:
    """The bytes before a step at any size: the model's the same at every captured size, the
    inputs' affine (StaticBytesError otherwise)."""
    base = statics[min(statics)]
    inputs = affine({s: static.inputs for s, static in statics.items()})
    if inputs is None or any(static.model != base.model for static in statics.values()):
        raise StaticBytesError(
            f"the bytes before a step are not the model's plus inputs affine in the size: "
            f"{statics}; remat fit needs parameters that do not change with the size"
        )

    def at(size: int) -> StaticBytes:
        return StaticBytes(
            base.parameters, base.gradients, base.optimizer_state, base.buffers, inputs(size)
        )

    return at
