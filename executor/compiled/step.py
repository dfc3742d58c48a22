"""The compiled training step: one region of torch.compile per try, run and measured.

Each try compiles a wrapper function with its own code object (`fresh_call`), so dynamo's
cache entries of a try belong to that wrapper and go with it: tries never count toward the
model's ``forward`` recompile limit nor leave entries on it. The graph is compiled whole
(``fullgraph=True``); a graph break is refused with its reason and place (`CompileError`).
"""

from __future__ import annotations

import time
import types
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from executor.compiled.partitioner import _Infeasible
from executor.errors import CompileError
from executor.loss import step_loss
from graph_capture.measurement.peak import Snapshot, measure_peak
from solver.deadline import Deadline

__all__ = ["StepMeasurement", "compiled_call", "fresh_call", "measure_step"]


@dataclass
class StepMeasurement:
    """One compiled step, compiled and measured: ``compile_seconds``, the first step's seconds
    (compiling, solving included); ``peak``, the measured step's peak bytes (None: not
    measured, the time left did not hold it); ``seconds``, the measured step's seconds."""

    compile_seconds: float
    peak: int | None
    seconds: float


def fresh_call(model: nn.Module) -> Callable[..., Any]:
    """``model(*args, **kwargs)`` as a function with a code object of its own."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return model(*args, **kwargs)

    code = call.__code__.replace(co_name=f"remat_step_{uuid.uuid4().hex[:12]}")
    return types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)


def compiled_call(model: nn.Module, backend: Callable | str) -> Callable[..., Any]:
    """``model`` compiled whole by ``backend``, static shapes."""
    return torch.compile(fresh_call(model), backend=backend, fullgraph=True, dynamic=False)


def _unwrap(error: BaseException) -> BaseException | None:
    """The remat error inside a dynamo error (dynamo wraps what a backend raises)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, CompileError | _Infeasible):
            return error
        error = getattr(error, "inner_exception", None) or error.__cause__
        seen += 1
    return None


def _where(error: BaseException) -> str:
    """Dynamo's reason (its message's first line) and the user code line it names."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    reason = lines[0] if lines else type(error).__name__
    places = [line for line in lines if line.startswith('File "')]
    return f"{reason} at {places[-1]}" if places else reason


def run_step(
    call: Callable[..., Any],
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
) -> torch.Tensor:
    """One training step through ``call``: forward, loss, backward; returns the loss. An
    output without a loss (`default_loss`) is refused as `CompileError`."""
    loss = step_loss(loss_fn, call(*inputs, **kwargs), CompileError)
    loss.backward()
    return loss.detach()


def measure_step(
    model: nn.Module,
    call: Callable[..., Any],
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
    loss_fn: Callable[[object], torch.Tensor],
    deadline: Deadline,
    expected_seconds: float,
) -> StepMeasurement:
    """Compile ``call`` (its first step), then, where ``deadline`` leaves the
    ``expected_seconds`` of a measured step, the measured peak bytes of one more step above
    what exists before it, every ``.grad`` None at its start (the gradients it creates count).
    The model's buffers, ``.grad`` and the CPU generator are left as found. A graph break, a
    symbolic shape or a plan that cannot be made raises `CompileError` (a budget the solver
    finds nothing within: the solver's error, as ``_Infeasible``)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    snapshot = Snapshot(model)
    try:
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        try:
            run_step(call, inputs, kwargs, loss_fn)
        except torch._dynamo.exc.TorchDynamoException as e:
            inner = _unwrap(e)
            if inner is not None:
                raise inner from e
            if isinstance(e, torch._dynamo.exc.BackendCompilerFailed):
                raise CompileError(
                    f"the backend failed on remat's partition: {e.inner_exception!r}"
                ) from e
            raise CompileError(
                f"torch.compile cannot compile the step as one graph: {_where(e)}; remat "
                "budgets one compiled region: remove the graph break or the data-dependent shape"
            ) from e
        compiled = time.perf_counter()
        if not deadline.leaves(expected_seconds):
            return StepMeasurement(compiled - started, None, 0.0)
        model.zero_grad(set_to_none=True)
        step = measure_peak(lambda: run_step(call, inputs, kwargs, loss_fn), device)
        return StepMeasurement(compiled - started, step.peak_bytes, time.perf_counter() - compiled)
    finally:
        snapshot.restore()
