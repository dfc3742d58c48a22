"""The check `executor.compile` makes before it hands a compiled model over.

One training step of the compiled model on the example inputs is held against a reference
step from the same parameters, buffers and generator state: the loss, every parameter's
``.grad`` and every buffer after the step. The reference is the step as torch would run it
without remat:

- ``aot_eager`` (the graphs run as they are, random draws replayed): eager itself, and every
  value must be `torch.equal` to it (bit for bit).
- ``inductor``: torch's own partition of the same model, compiled with the same inductor
  options. Inductor fuses and reorders reductions differently for another partition, so a
  value passes where its largest difference is at most ``rtol`` times the reference value's
  largest magnitude (`CompileCheck`).

A value that fails is a `CompileError` naming it: the model is never returned. The check costs
one more step of the compiled model and one reference step (under inductor a compile of
torch's partition: about as long as one of remat's compiles); `CheckReport.seconds` says what
it took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from executor.compiled.step import run_step
from executor.errors import CompileError
from graph_capture.measurement.peak import Snapshot

__all__ = ["CheckReport", "CompileCheck", "check_step", "relative_difference"]


@dataclass(frozen=True)
class CompileCheck:
    """How `executor.compile` checks its result. ``rtol``: under inductor, the largest
    difference allowed in a value, relative to the reference value's largest magnitude
    (aot_eager is always checked bit for bit)."""

    rtol: float = 1e-3


@dataclass(frozen=True)
class CheckReport:
    """The check's outcome: ``reference`` ("eager" or "torch's partition"), ``exact`` (bit for
    bit required), ``worst`` (the largest relative difference over every value: 0.0 where all
    are equal), ``values`` (how many tensors were compared) and ``seconds`` (wall seconds of
    the check, the reference's compile included)."""

    reference: str
    exact: bool
    worst: float
    values: int
    seconds: float


def _step_values(
    model: nn.Module,
    call: Callable[..., object],
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
) -> list[tuple[str, torch.Tensor]]:
    """(name, value) after one step through ``call`` from ``.grad`` None: the loss, each
    parameter's gradient ("grad of NAME"; a parameter the step leaves without one is skipped
    on both sides by name), each buffer ("buffer NAME")."""
    model.zero_grad(set_to_none=True)
    loss = run_step(call, inputs, kwargs, loss_fn)
    values = [("the loss", loss.detach().clone())]
    values += [
        (f"grad of {n}", p.grad.clone()) for n, p in model.named_parameters() if p.grad is not None
    ]
    values += [(f"buffer {n}", b.detach().clone()) for n, b in model.named_buffers()]
    return values


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


def check_step(
    model: nn.Module,
    call: Callable[..., object],
    reference: Callable[..., object],
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    exact: bool,
    options: CompileCheck,
    reference_name: str,
    random_ops: bool,
) -> CheckReport:
    """Hold one step through ``call`` (remat's compiled model) against one through
    ``reference`` from the same state (module docstring); ``exact``: bit for bit, else within
    ``options.rtol``. ``random_ops``: the graph draws random numbers (named in the error,
    since inductor's partitions can draw them in another order). The model's buffers,
    ``.grad`` and the generator are left as found. Raises `CompileError` naming the first
    value that differs."""
    started = time.perf_counter()
    snapshot = Snapshot(model)
    try:
        expected = _step_values(model, reference, inputs, kwargs, loss_fn)
        snapshot.restore()
        got = _step_values(model, call, inputs, kwargs, loss_fn)
    finally:
        snapshot.restore()
    if [n for n, _ in got] != [n for n, _ in expected]:
        missing = sorted({n for n, _ in expected} ^ {n for n, _ in got})
        raise CompileError(
            f"remat's compiled step and {reference_name} leave different values ({missing[0]} "
            "in one only); this is a defect in remat: report it with the model"
        )
    worst = 0.0
    for (name, value), (_, ref) in zip(got, expected, strict=True):
        diff = relative_difference(value, ref)
        worst = max(worst, diff)
        if (exact and diff > 0) or diff > options.rtol:
            within = "bit for bit" if exact else f"within rtol {options.rtol:g}"
            hint = (
                "; the graph draws random numbers, which inductor may draw in another order "
                "for another partition: check with backend='aot_eager'"
                if random_ops and not exact
                else ""
            )
            raise CompileError(
                f"remat's compiled step differs from {reference_name}: {name} (relative "
                f"difference {diff:.3g}, not {within}){hint}; no model is returned: report "
                "it with the model, and compile without remat meanwhile"
            )
    return CheckReport(reference_name, exact, worst, len(got), time.perf_counter() - started)
