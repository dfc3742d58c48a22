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

__all__ = ["CheckReport", "NamedValues", "Noise", "check_step", "relative_difference"]

NamedValues = list[tuple[str, torch.Tensor]]
"""What a step returns to be compared beside ``.grad`` and the buffers: (name, value) pairs,
e.g. ``[("the loss", loss)]``; each value detached and not aliasing anything the next step
writes."""


@dataclass(frozen=True)
class CheckReport:
    """The check's outcome: ``reference`` (what the step was held against), ``exact`` (bit for
    bit required), ``worst`` (the largest relative difference over the values held to the
    tolerance: 0.0 where all are equal), ``values`` (how many tensors were compared),
    ``seconds`` (wall seconds of the check, every step and whatever the reference compiled)
    and ``noise`` (the values of rounding noise's size that passed by `Noise`'s allowance)."""

    reference: str
    exact: bool
    worst: float
    values: int
    seconds: float
    noise: tuple[str, ...] = ()


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


def _magnitude(value: torch.Tensor) -> float | None:
    """The largest finite magnitude of a floating ``value`` (None: not floating, or nothing
    finite)."""
    if not value.is_floating_point():
        return None
    finite = value[torch.isfinite(value)]
    return finite.abs().max().item() if finite.numel() else None


def _largest(values: NamedValues) -> dict[str, float]:
    """Kind -> the largest finite magnitude among the floating values of that kind."""
    largest: dict[str, float] = {}
    for name, value in values:
        kind, top = _kind(name), _magnitude(value)
        if kind is not None and top is not None:
            largest[kind] = max(largest.get(kind, 0.0), top)
    return largest


def _noise_sized(name: str, ref: torch.Tensor, largest: dict[str, float], small: float) -> bool:
    """Whether ``ref`` (a gradient or buffer) is at most ``small`` times the largest of its kind."""
    top, own = largest.get(_kind(name) or "", 0.0), _magnitude(ref)
    return top > 0.0 and own is not None and own <= small * top


@dataclass(frozen=True)
class Noise:
    """Where a value may differ from the reference by more than ``rtol``: a value that cancels
    to rounding noise (a BatchNorm's bias before a linear layer and another BatchNorm in
    training mode: analytically zero) is rounded differently by each partition, and its
    relative difference is noise over noise. ``step``: a third step from the same state
    (eager) whose distance from the reference measures that noise. A value whose reference
    magnitude is at most ``small`` times the largest of its kind (gradients, buffers) passes
    where its difference is at most ``factor`` times the reference's own distance from
    ``step``'s; every other value is held to ``rtol``."""

    step: Callable[[], NamedValues]
    name: str
    small: float = 1e-3
    factor: float = 10.0


@dataclass(frozen=True)
class Failure:
    """How `check_step` reports a step that differs: ``error`` raised naming ``subject`` (the
    step checked) against ``reference_name`` (the step it is held to), ending with ``advice``
    (what to do)."""

    subject: str
    reference_name: str
    error: type[ExecutorError]
    advice: str


def check_step(
    model: nn.Module,
    step: Callable[[], NamedValues],
    reference: Callable[[], NamedValues],
    failure: Failure,
    *,
    rtol: float | None = None,
    noise: Noise | None = None,
) -> CheckReport:
    """Hold ``step`` (one training step of the model to hand over, on ``model``'s parameters)
    against ``reference`` from the same state (module docstring). ``rtol`` None: every value
    must be `torch.equal` to the reference's; else its `relative_difference` at most ``rtol``,
    or, for a value of rounding noise's size, at most `Noise`'s allowance (``noise``).
    Raises ``failure.error`` naming ``failure.subject``, the first value that differs and its
    relative difference, then ``failure.advice`` (the model is not returned)."""
    subject, reference_name = failure.subject, failure.reference_name
    error, advice = failure.error, failure.advice
    started = time.perf_counter()
    snapshot = Snapshot(model)
    try:
        expected = _step_values(model, reference)
        snapshot.restore()
        got = _step_values(model, step)
        if noise is not None and rtol is not None:
            snapshot.restore()
            third = dict(_step_values(model, noise.step))
    finally:
        snapshot.restore()
    if [n for n, _ in got] != [n for n, _ in expected]:
        missing = sorted({n for n, _ in expected} ^ {n for n, _ in got})
        raise error(
            f"{subject} and {reference_name} leave different values ({missing[0]} in one "
            "only); this is a defect in remat: report it with the model"
        )
    worst, noisy = 0.0, []
    largest = _largest(expected) if noise is not None and rtol is not None else {}
    for (name, value), (_, ref) in zip(got, expected, strict=True):
        diff = relative_difference(value, ref)
        allowed, within = 0.0, "bit for bit"
        if rtol is not None:
            allowed, within = rtol, f"within rtol {rtol:g}"
        if diff > allowed and noise is not None and _noise_sized(name, ref, largest, noise.small):
            own = relative_difference(ref, third[name]) if name in third else 0.0
            if diff <= noise.factor * own < float("inf"):
                noisy.append(name)
                continue
            within += f" nor {noise.factor:g} times its own distance from {noise.name} ({own:.3g})"
        worst = max(worst, diff)
        if diff > allowed:
            raise error(
                f"{subject} differs from {reference_name}: {name} (relative difference "
                f"{diff:.3g}, not {within}); no model is returned: {advice}"
            )
    exact = rtol is None
    seconds = time.perf_counter() - started
    return CheckReport(reference_name, exact, worst, len(got), seconds, tuple(noisy))
