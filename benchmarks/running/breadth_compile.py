"""The breadth benchmark's compile cells (`compile_cells`): `executor.compile` under inductor at
"min" and at the budget, against eager and torch's own compiled step.

The compile cells are not bit for bit: inductor reorders reductions. Both compiled steps,
remat's and torch's own (``torch.compile`` of a third copy with the same inductor options,
`COMPILE_OPTIONS`: random ops drawn by eager's kernels), train beside eager over the same
steps, each step from eager's state (`start_from`: a distance is one step's, not the drift of
earlier steps' rounding). Each value's distance from eager's is `relative_difference` (its
largest difference over eager's largest magnitude, at least ``--floor``). A compile cell is
``close`` (every value within ``--rtol``), ``as torch.compile`` (a value beyond ``--rtol`` but
no more than ``--factor`` times as far as torch's own compiled step's) or ``WRONG``
(`CompileTolerance.wrong`), and reports both largest distances: remat's, then torch.compile's.
The evaluations are not run for compile: without gradients the compiled forward is torch's
inference graph, with no partition.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from benchmarks.running.breadth_models import ARCHITECTURES, TorchvisionMissing
from benchmarks.running.breadth_report import Cell, _one_line, _refusal
from benchmarks.running.breadth_steps import LR, measured_peak, train_step
from executor.check import relative_difference
from executor.compiled.partitioner import LAYOUT

COMPILE_OPTIONS = {**LAYOUT, "fallback_random": True}
"""Inductor's options for both compiled steps (remat's and torch's own): executor.compile's
layout (`LAYOUT`), and random ops drawn by eager's kernels from the global generator
(``fallback_random``), so that a compiled step draws eager's masks and can be compared with
eager at all (with inductor's own seeds every dropout mask differs from eager's)."""


@dataclass(frozen=True)
class CompileTolerance:
    """When a compiled step is close to eager. ``rtol``: a value is close where its largest
    difference from eager's is at most ``rtol`` times eager's largest magnitude (at least
    ``floor``: a value whose reference is ~0, such as a gradient that cancels to rounding
    noise, is compared in absolute terms, ``rtol * floor``)."""

    rtol: float = 1e-3
    floor: float = 1e-3
    factor: float = 10.0

    def wrong(self, remat: float, torch_own: float) -> bool:
        """True where remat's distance from eager is beyond ``rtol`` and more than ``factor``
        times torch's own compiled step's: where a value is ill-conditioned within one step,
        two correct compiled steps are both far from eager's rounding on it (ResNet-50 at batch
        2 and 32x32, its last stage normalised over 2 values: 8.2 relative in both from eager's
        state), so only an order of magnitude sets a defect apart."""
        return remat > self.rtol and remat > self.factor * torch_own


class _Compiled:
    """One compile cell in the making: its model, the compiled call (None until built or
    after a refusal) and the largest distances from eager so far: remat's and torch's own
    compiled step's on the same values (`CompileTolerance`)."""

    def __init__(self, cell: Cell, model: nn.Module) -> None:
        self.cell = cell
        self.model = model
        self.call: Callable | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.remat = 0.0
        self.torch = 0.0

    def refuse(self, result: str, started: float) -> None:
        self.cell.result, self.call = result, None
        self.cell.seconds += time.perf_counter() - started


def start_from(eager: nn.Module, model: nn.Module) -> None:
    """Copy `eager`'s parameters and buffers into `model`'s, in place (a compiled step holds them),
    so that each compiled step is judged from eager's state; what the step leaves (buffers,
    updated parameters) is still compared. Trained in lockstep instead, each model would
    step from its own state, and on an ill-conditioned value the rounding of earlier steps
    decides the distance. torchvision's ShuffleNetV2 at 32x32 normalises its last stage over
    2 values (1x1 maps, batch 2): at step 1 eager's gradient of its first convolution is
    0.032 relative from float64's, and eager started from parameters scaled by 1 + 1e-6
    noise is up to 0.83 from eager's gradients. In lockstep remat's compiled step was 0.14
    from eager there and torch's own 0.0026 (in another run both 0.14); from eager's state
    both are within 5.4e-4 of eager."""
    with torch.no_grad():
        for mine, theirs in zip(model.parameters(), eager.parameters(), strict=True):
            mine.copy_(theirs)
        for mine, theirs in zip(model.buffers(), eager.buffers(), strict=True):
            mine.copy_(theirs)


def _distances(want: dict, got: dict, floor: float) -> dict[str, float]:
    """Each value's relative difference from eager's (`relative_difference`, at least `floor`
    as the scale): 0 where both are None (a parameter the loss does not reach has no `.grad`),
    infinite where only one is."""
    return {key: _distance(got[key], ref, floor) for key, ref in want.items()}


def _distance(got: torch.Tensor | None, want: torch.Tensor | None, floor: float) -> float:
    if got is None or want is None:
        return 0.0 if got is want else math.inf
    return relative_difference(got, want, floor)


def _close(remat: float, torch_own: float) -> str:
    return f"{remat:.2g} (torch.compile {torch_own:.2g})"


def compile_cells(
    name: str,
    budget: str,
    steps: int,
    time_limit: float,
    tolerance: CompileTolerance,
    eager_differs_at: int | None = None,
) -> list[Cell]:
    """`executor.compile` (inductor, `COMPILE_OPTIONS`) at "min" and at `budget` on copies of one
    architecture's model, trained beside eager and torch's own compiled step
    (``torch.compile`` with the same options), each step from eager's state (`start_from`);
    never raises. ``mid`` is midway between the "min" compile's measured peak and torch's
    own compiled step's (`plain_step_peak`, after its compile), the "min" compile's where
    torch's peaks lower (its partition is not remat's model: on small convolutional models
    it can); `time_limit` bounds each executor.compile call. A cell is ``close`` where every
    value is within `tolerance` of eager's, ``as torch.compile`` where a value is not but
    torch's own compiled step is nearly as far from eager's on it, WRONG where `tolerance`
    says so; each reports remat's largest distance and torch's. The first cell's seconds
    include eager's steps and torch's compile."""
    from torch._inductor.compile_fx import compile_fx

    import executor
    from executor.compiled.step import compiled_call
    from graph_capture.measurement.peak import Snapshot, plain_step_peak

    family, make = ARCHITECTURES[name]
    started = time.perf_counter()
    torch.manual_seed(0)
    try:
        case = make()
    except TorchvisionMissing as missing:
        return [Cell(name, family, r, f"skipped: {missing}") for r in compile_runtimes(budget)]
    eager, own = copy.deepcopy(case.model), copy.deepcopy(case.model)
    models = [case.model] + [copy.deepcopy(case.model) for _ in compile_runtimes(budget)[1:]]
    runs = [
        _Compiled(Cell(name, family, runtime, ""), model)
        for runtime, model in zip(compile_runtimes(budget), models, strict=True)
    ]
    # compiled as executor.compile compiles (whole, static shapes), with torch's partition
    inductor = functools.partial(compile_fx, config_patches=dict(COMPILE_OPTIONS))
    reference = compiled_call(own, inductor)

    def step() -> None:
        case.loss_fn(reference(*case.inputs, **case.kwargs)).backward()

    snapshot = Snapshot(own)
    try:
        # compiled first: executor.compile's check compiles this graph again, from the cache
        step()
        plain: int | Exception = plain_step_peak(own, step)
    except Exception as error:
        plain = error
    finally:
        snapshot.restore()
    least: int | None = None
    for run in runs:
        at = run.cell.runtime.removeprefix("compile ")
        began = time.perf_counter()
        try:
            if at == "mid":
                if least is None:
                    raise RuntimeError("no 'min' compile to be midway from")
                if isinstance(plain, Exception):
                    raise RuntimeError(f"torch's own compiled step: {_one_line(plain)}")
                at = (least + max(least, plain)) // 2
            compiled = executor.compile(
                run.model,
                case.inputs,
                at,
                example_kwargs=case.kwargs,
                loss_fn=case.loss_fn,
                time_limit=time_limit,
                backend="inductor",
                options=dict(COMPILE_OPTIONS),
            )
        except Exception as error:
            run.refuse(_refusal(error), began)
            continue
        least = compiled.remat.peak if at == "min" else least
        run.call, run.cell.budget = compiled, compiled.remat.budget
        recomputes = sum(r.schedule.recomputes for r in compiled.remat.regions)
        run.cell.checkpointed = f"{recomputes} recomputes"
        run.opt = torch.optim.SGD(run.model.parameters(), lr=LR)
        run.cell.seconds += time.perf_counter() - began
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (eager, own)]
    try:
        for k in range(steps):
            if not any(run.call for run in runs):
                break
            for model in (own, *(run.model for run in runs if run.call is not None)):
                start_from(eager, model)
            want = train_step(eager, eager, case, opts[0], k)
            theirs = _distances(want, train_step(reference, own, case, opts[1], k), tolerance.floor)
            for run in (run for run in runs if run.call is not None):
                began = time.perf_counter()
                try:
                    got = train_step(run.call, run.model, case, run.opt, k)
                except Exception as error:
                    run.refuse(_refusal(error), began)
                    continue
                run.cell.seconds += time.perf_counter() - began
                for key, remat in _distances(want, got, tolerance.floor).items():
                    run.remat, run.torch = max(run.remat, remat), max(run.torch, theirs[key])
                    if tolerance.wrong(remat, theirs[key]) and run.call is not None:
                        run.cell.differs_at = k
                        kind = "WRONG"
                        if eager_differs_at is not None and k >= eager_differs_at:
                            kind = "as eager"
                        differs = f"{key} differs by {_close(remat, theirs[key])} at step {k}"
                        run.refuse(f"{kind}: {differs}", time.perf_counter())
    except Exception as error:  # eager's step or torch's own compiled step
        for run in runs:
            if run.call is not None:
                why = f"refused: torch's own compiled step: {_one_line(error)}"
                run.refuse(why, time.perf_counter())
    for run in runs:
        if run.call is None:
            continue
        began = time.perf_counter()
        run.cell.peak = measured_peak(run.call, run.model, case, "compile")
        far = run.remat > tolerance.rtol
        result = "as torch.compile" if far else "close"
        if run.cell.budget is not None and run.cell.peak > run.cell.budget:
            result = "over budget"
        run.cell.result = f"{result}: {_close(run.remat, run.torch)}"
        run.cell.seconds += time.perf_counter() - began
    runs[0].cell.seconds += time.perf_counter() - started - sum(run.cell.seconds for run in runs)
    return [run.cell for run in runs]


def compile_runtimes(budget: str) -> tuple[str, ...]:
    """The compile cells' runtimes: executor.compile at "min", then at `budget`."""
    return tuple(dict.fromkeys(("compile min", f"compile {budget}")))
