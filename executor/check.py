"""The check a runtime makes before it hands a model over: one step against a reference.

One training step of the model the runtime is about to return is held against one reference
step from the same state: parameters (a step does not change them), buffers, ``.grad`` (None
at the start of each step) and the generator states (`Snapshot`). Compared: the values each
step returns (the loss, or the outputs), every parameter's ``.grad`` and every buffer after
the step. Used by the own executor (`executor.rematerialize`, `Rematerialized.load`, against
eager, bit for bit) and by `executor.compile` (against eager bit for bit under aot_eager, or
within a tolerance of torch's own partition under inductor).

A value that fails raises the runtime's error class naming it (``grad of layers.0.weight``,
``the loss``, ``buffer bn.running_mean``) with its relative difference and what to do: the
model is never returned. The check costs one step of each (`CheckReport.seconds`); the model's
buffers, ``.grad`` and generator states are left as found.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from executor.errors import ExecutorError
from graph_capture.measurement.peak import Snapshot

__all__ = ["CheckReport", "NamedValues", "check_step", "relative_difference"]

NamedValues = list[tuple[str, torch.Tensor]]
"""What a step returns to be compared beside ``.grad`` and the buffers: (name, value) pairs,
e.g. ``[("the loss", loss)]``; each value detached and not aliasing anything the next step
writes."""


@dataclass(frozen=True)
class CheckReport:
    """The check's outcome: ``reference`` (what the step was held against), ``exact`` (bit for
    bit required), ``worst`` (the largest relative difference over every value: 0.0 where all
    are equal), ``values`` (how many tensors were compared) and ``seconds`` (wall seconds of
    the check, both steps and whatever the reference compiled)."""

    reference: str
    exact: bool
    worst: float
    values: int
    seconds: float


def relative_difference(value: torch.Tensor, reference: torch.Tensor, floor: float = 0.0) -> float:
    """The largest elementwise difference relative to the reference's largest magnitude, or
    to ``floor`` where that is larger (0.0 where equal, inf where shapes, dtypes or non-finite
    positions differ)."""
    if value.shape != reference.shape or value.dtype != reference.dtype:
        return float("inf")
    if torch.equal(value, reference):
        return 0.0
    if not value.is_floating_point():
        return float("inf")
    a, b = value.double(), reference.double()
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite) or not torch.equal(a[~finite], b[~finite]):
        return float("inf")
    scale = max(b[finite].abs().max().item() if finite.any() else 0.0, floor)
    diff = (a[finite] - b[finite]).abs().max().item()
    return diff / scale if scale > 0 else float("inf")


def _step_values(model: nn.Module, step: Callable[[], NamedValues]) -> NamedValues:
    """``step()`` from ``.grad`` None, then each parameter's gradient ("grad of NAME"; a
    parameter the step leaves without one is skipped by name) and each buffer ("buffer
    NAME")."""
    model.zero_grad(set_to_none=True)
    values = list(step())
    values += [
        (f"grad of {n}", p.grad.clone()) for n, p in model.named_parameters() if p.grad is not None
    ]
    values += [(f"buffer {n}", b.detach().clone()) for n, b in model.named_buffers()]
    return values


_KINDS = ("grad of ", "buffer ")


def _kind(name: str) -> str | None:
    """ "grad of " or "buffer " for a gradient's or a buffer's name, None for another value."""
    return next((k for k in _KINDS if name.startswith(k)), None)


def _floors(values: NamedValues, floor: float) -> dict[str, float]:
    """Kind -> ``floor`` times the largest finite magnitude among the floating values of that
    kind: a gradient that cancels to rounding noise (BatchNorm's bias where a linear layer and
    another BatchNorm in training mode follow: analytically zero) is held to the scale of the
    step's gradients, not to its own noise."""
    largest: dict[str, float] = {}
    for name, value in values:
        kind = _kind(name)
        if kind is None or not value.is_floating_point() or value.numel() == 0:
            continue
        finite = value[torch.isfinite(value)]
        if finite.numel():
            top = finite.abs().max().item()
            largest[kind] = max(largest.get(kind, 0.0), top)
    return {kind: floor * top for kind, top in largest.items()}


def check_step(
    model: nn.Module,
    step: Callable[[], NamedValues],
    reference: Callable[[], NamedValues],
    *,
    subject: str,
    reference_name: str,
    error: type[ExecutorError],
    advice: str,
    rtol: float | None = None,
    floor: float = 0.0,
) -> CheckReport:
    """Hold ``step`` (one training step of the model to hand over, on ``model``'s parameters)
    against ``reference`` from the same state (module docstring). ``rtol`` None: every value
    must be `torch.equal` to the reference's; else its `relative_difference` at most ``rtol``,
    the scale of each gradient at least ``floor`` times the largest magnitude of the
    reference's gradients, and of each buffer ``floor`` times its buffers' (`_floors`).
    Raises ``error`` naming ``subject``, the first value that differs and its relative
    difference, then ``advice`` (what to do; the model is not returned)."""
    started = time.perf_counter()
    snapshot = Snapshot(model)
    try:
        expected = _step_values(model, reference)
        snapshot.restore()
        got = _step_values(model, step)
    finally:
        snapshot.restore()
    if [n for n, _ in got] != [n for n, _ in expected]:
        missing = sorted({n for n, _ in expected} ^ {n for n, _ in got})
        raise error(
            f"{subject} and {reference_name} leave different values ({missing[0]} in one "
            "only); this is a defect in remat: report it with the model"
        )
    worst = 0.0
    floors = _floors(expected, floor if rtol is not None else 0.0)
    for (name, value), (_, ref) in zip(got, expected, strict=True):
        diff = relative_difference(value, ref, floors.get(_kind(name), 0.0))
        worst = max(worst, diff)
        if diff > (0.0 if rtol is None else rtol):
            within = "bit for bit" if rtol is None else f"within rtol {rtol:g}"
            raise error(
                f"{subject} differs from {reference_name}: {name} (relative difference "
                f"{diff:.3g}, not {within}); no model is returned: {advice}"
            )
    exact = rtol is None
    return CheckReport(reference_name, exact, worst, len(got), time.perf_counter() - started)
