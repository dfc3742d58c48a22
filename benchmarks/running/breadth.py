"""Breadth: third-party architectures (HuggingFace transformers, torchvision; small configs,
random init, dropout on) trained in each runtime against eager on an identical copy.

    python -m benchmarks.running.breadth                        # every architecture, every runtime
    python -m benchmarks.running.breadth --only gpt2 tv_resnet18 --steps 3 --out breadth.md --json
        b.json
    python -m benchmarks.running.breadth --only gpt2 --runtimes compile    # the control and compile

Per architecture (`benchmarks.running.breadth_models`), these cells:

- ``eager``: the control, a second copy trained plainly: eager against itself;
- ``remat``: remat's own executor (`executor.rematerialize`; HF models captured with
  ``backward_from=["loss"]``);
- ``sac``: a SAC plan (`executor.checkpoint_plan`, `CheckpointPlan.apply`);
- ``compile min`` and ``compile mid`` (``compile <budget>``): `executor.compile` under
  inductor at "min" and at the budget (`compile_cells`).

The model is copied (`copy.deepcopy`) before anything runs; the runtime is built on the model
itself, then both train ``--steps`` SGD steps, each step from the same seed, one thread. After
every step, compared bit for bit (`same_bits`: `torch.equal`, NaNs included): the loss, every
parameter's ``.grad``, every buffer (BatchNorm running statistics and ``num_batches_tracked``)
and every parameter after the SGD step. After the steps, one forward without gradients under
`torch.no_grad` in training mode and one under `torch.inference_mode` in eval mode
(`EVALUATIONS`), their losses and buffers compared the same way. Then one more step of the
runtime is measured (`executor.measure_peak`: profiler allocation events, bytes above the
step's start) the way each runtime states its budget: the own executor with ``.grad``
allocated before the step (`remat run`), the SAC plan, compile and eager with ``.grad`` set to
None before it (`remat sac`, `executor.compile`). ``checkpointed``: the schedule's recomputes,
or the plan's checkpointed regions.

The budget (``--budget``, default ``mid``): ``mid`` is midway between the least peak found and 100%:
for the own executor between the least peak (`solver.solve`, objective "memory") and the
checkpoint-all peak, for SAC between the plan at ``"min"`` (its predicted peak) and the step without
checkpointing, for compile between the "min" compile's measured peak and torch's own compiled
step's. Any other value goes to every API as it is (bytes, ``"60%"``, ``"min"``); 100% is the
measured plain step for the own executor and SAC (their steps differ by the loss's few bytes),
the plain compiled step for compile.

The compile cells are not bit for bit: inductor reorders reductions. Both compiled steps,
remat's and torch's own (``torch.compile`` of a third copy with the same inductor options,
`COMPILE_OPTIONS`: random ops drawn by eager's kernels), train in lockstep with eager over the
same steps, and each value's distance from eager's is `relative_difference` (its largest
difference over eager's largest magnitude, at least ``--floor``). A compile cell is ``close``
(every value within ``--rtol``), ``as torch.compile`` (a value beyond ``--rtol`` but no more
than ``--factor`` times as far as torch's own compiled step's) or ``WRONG``
(`CompileTolerance.wrong`), and reports both largest distances: remat's, then
torch.compile's. The evaluations are not run for compile: without gradients the compiled
forward is torch's inference graph, with no partition.

Each cell is one of ``equal`` (bit-identical on every step and measured peak within the budget),
``close`` or ``as torch.compile`` (compile), ``WRONG: <tensor> differs at step k`` (exit
status 1), ``over budget`` or ``refused: <error>`` (the exception's type and first line, and
its cause's); the control is ``equal`` or ``NOT REPRODUCIBLE``, and a runtime that first
differs at or after the step where the control did is ``as eager`` rather than WRONG. Each
architecture runs in its own subprocess under ``--row-timeout`` seconds; a failure there is
recorded and the others go on. ``seconds`` is the cell's wall time: planning (compiling), the
eager and runtime steps and the measured step.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from benchmarks.running.breadth_models import ARCHITECTURES, Case, TorchvisionMissing, hf_loss
from executor.check import relative_difference
from executor.compiled.partitioner import LAYOUT

RUNTIMES = ("eager", "remat", "sac")
"""``eager``: the control, a second copy trained plainly against the first."""
SEED = 1234
LR = 0.01
COLUMNS = (
    "architecture",
    "family",
    "runtime",
    "result",
    "checkpointed",
    "measured peak",
    "budget",
    "seconds",
)
KINDS = (
    "equal",
    "close",
    "as torch.compile",
    "WRONG",
    "over budget",
    "refused",
    "NOT REPRODUCIBLE",
    "as eager",
    "skipped",
)
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
        times torch's own compiled step's: two correct compiled steps are both rounding away
        from eager's, amplified alike over the steps (ResNet-50 at batch 2: a BatchNorm
        statistic 1e4 away in both at step 1), so only an order of magnitude sets them apart."""
        return remat > self.rtol and remat > self.factor * torch_own


@dataclass
class Cell:
    """One architecture in one runtime: the result and its numbers (bytes, seconds)."""

    architecture: str
    family: str
    runtime: str
    result: str
    checkpointed: str = "-"
    peak: int | None = None
    budget: int | None = None
    seconds: float = 0.0
    differs_at: int | None = None

    def markdown(self) -> str:
        values = (
            self.architecture,
            self.family,
            self.runtime,
            self.result.replace("|", "\\|"),
            self.checkpointed,
            _mib(self.peak),
            _mib(self.budget),
            f"{self.seconds:.1f}",
        )
        return "| " + " | ".join(values) + " |"


class Mismatch(Exception):
    """The runtime's step differs from eager's at step `step`."""

    def __init__(self, difference: str, step: int) -> None:
        super().__init__(f"{difference} at step {step}")
        self.step = step


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f} MiB"


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _refusal(error: BaseException) -> str:
    """``refused: Type: first line``, with the chained cause's where there is one."""
    cause = f" (from {_one_line(error.__cause__)})" if error.__cause__ is not None else ""
    return f"refused: {_one_line(error)}{cause}"


def train_step(module: Callable, model: nn.Module, case: Case, opt, step: int) -> dict:
    """One step of `module` (training `model`'s parameters) from the step's seed; returns the
    loss, every `.grad`, every buffer after the step and every parameter after the update."""
    torch.manual_seed(SEED + step)
    loss = case.loss_fn(module(*case.inputs, **case.kwargs))
    loss.backward()
    state = {"loss": loss.detach().clone()}
    for name, p in model.named_parameters():
        state[f".grad of {name}"] = None if p.grad is None else p.grad.clone()
    for name, b in model.named_buffers():
        state[f"buffer {name}"] = b.clone()
    opt.step()
    for name, p in model.named_parameters():
        state[f"{name} after the SGD step"] = p.detach().clone()
    opt.zero_grad(set_to_none=False)
    return state


EVALUATIONS = ("no_grad", "inference_mode")
"""After the training steps, one forward without gradients each way: under `torch.no_grad` in
training mode (dropout and BatchNorm statistics as in training) and under
`torch.inference_mode` in eval mode (an evaluation loop)."""


def evaluate(module: Callable, model: nn.Module, case: Case, mode: str) -> dict:
    """The loss of one forward of `module` under `mode` (`EVALUATIONS`) from the seed, and
    every buffer after it; `model` is left in training mode."""
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    for m in {id(module): module, id(model): model}.values():
        if isinstance(m, nn.Module):
            m.train(mode == "no_grad")
    try:
        torch.manual_seed(SEED - 1)
        with context:
            state = {"loss": case.loss_fn(module(*case.inputs, **case.kwargs)).clone()}
            state |= {f"buffer {name}": b.clone() for name, b in model.named_buffers()}
    finally:
        for m in (module, model):
            if isinstance(m, nn.Module):
                m.train(True)
    return state


def same_bits(a: object, b: object) -> bool:
    """`a` and `b` are both None, or tensors of one dtype and shape holding the same bits
    (floating point compared as integers of its width: NaNs compare, and -0.0 is not 0.0)."""
    if a is None or b is None:
        return a is None and b is None
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def first_difference(want: dict, got: dict) -> str | None:
    """The first tensor of `want` that `got` does not hold bit for bit, with how many more
    differ; None when all are equal."""
    differ = []
    for key, a in want.items():
        if not same_bits(a, got.get(key, "missing")):
            differ.append(key)
    differ += [key for key in got if key not in want]
    if not differ:
        return None
    more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
    return f"{differ[0]} differs{more}"


def _capture_options(case: Case) -> dict:
    return {"repeats": 1, **({"backward_from": ["loss"]} if case.loss_fn is hf_loss else {})}


Built = tuple[Callable, int | None, str]
"""A runtime on a case's model: (the module to call, budget bytes, what it checkpoints)."""


def plain(case: Case, budget: str, time_limit: float) -> Built:
    """The control: the model itself, no budget."""
    return case.model, None, "-"


def own_executor(case: Case, budget: str, time_limit: float) -> Built:
    """remat's own executor on `case.model` at `budget`."""
    import executor
    import solver
    from graph_capture import capture

    if budget != "mid":
        rm = executor.rematerialize(
            case.model,
            case.inputs,
            budget,
            example_kwargs=case.kwargs,
            capture_options=_capture_options(case),
            time_limit=time_limit,
        )
        return rm, rm.schedule.budget, f"{rm.schedule.recomputes} recomputes"
    captured = capture(case.model, case.inputs, case.kwargs, **_capture_options(case))
    least = solver.solve(captured.dag, objective="memory", time_limit=time_limit).peak
    full = solver.checkpoint_all_peak(solver.prepare(captured.dag))
    schedule = solver.solve(captured.dag, budget=(least + full) // 2, time_limit=time_limit)
    rm = executor.Rematerialized(case.model, captured, schedule)
    return rm, schedule.budget, f"{schedule.recomputes} recomputes"


def sac_plan(case: Case, budget: str, time_limit: float) -> Built:
    """A SAC plan applied to `case.model` at `budget`."""
    import executor

    def plan_at(value: str | int):
        return executor.checkpoint_plan(
            case.model,
            case.inputs,
            value,
            example_kwargs=case.kwargs,
            loss_fn=case.loss_fn,
            time_limit=time_limit,
        )

    if budget == "mid":
        least = plan_at("min")
        budget = (least.peak + least.plain_peak) // 2
    plan = plan_at(budget)
    regions = f"{len(plan.checkpointed_regions())} of {len(plan.regions)} regions"
    return plan.apply(case.model), plan.budget, regions


BUILD = {"eager": plain, "remat": own_executor, "sac": sac_plan}


def measured_peak(module: Callable, model: nn.Module, case: Case, runtime: str) -> int:
    """The measured peak (bytes above the step's start) of one step of `module`, `.grad`
    allocated before it for the own executor and set to None otherwise; RNG restored after."""
    from executor import measure_peak

    model.zero_grad(set_to_none=runtime != "remat")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return measure_peak(
            lambda: case.loss_fn(module(*case.inputs, **case.kwargs)).backward()
        ).peak_bytes


def run_cell(
    name: str,
    runtime: str,
    budget: str,
    steps: int,
    time_limit: float,
    eager_differs_at: int | None = None,
) -> Cell:
    """One architecture in one runtime against eager; never raises. `eager_differs_at`: the
    first step at which the control (eager against eager) differed; a runtime that first
    differs there or later is reported ``as eager`` rather than WRONG."""
    family, make = ARCHITECTURES[name]
    cell = Cell(name, family, runtime, "")
    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        case = make()
        eager = copy.deepcopy(case.model)
        module, cell.budget, cell.checkpointed = BUILD[runtime](case, budget, time_limit)
        runs = [(eager, eager), (module, case.model)]
        opts = [torch.optim.SGD(model.parameters(), lr=LR) for _, model in runs]
        for step in range(steps):
            want, got = (
                train_step(call, model, case, opt, step)
                for (call, model), opt in zip(runs, opts, strict=True)
            )
            difference = first_difference(want, got)
            if difference:
                raise Mismatch(difference, step)
        for mode in EVALUATIONS:
            want, got = (evaluate(call, model, case, mode) for call, model in runs)
            difference = first_difference(want, got)
            if difference:
                raise Mismatch(f"{difference} under {mode}", steps)
        cell.peak = measured_peak(module, case.model, case, runtime)
        within = cell.budget is None or cell.peak <= cell.budget
        cell.result = "equal" if within else "over budget"
    except Mismatch as wrong:
        cell.differs_at = wrong.step
        if runtime == "eager":
            cell.result = f"NOT REPRODUCIBLE: {wrong}"
        elif eager_differs_at is not None and wrong.step >= eager_differs_at:
            cell.result = (
                f"as eager: {wrong} (eager against eager differs from step {eager_differs_at})"
            )
        else:
            cell.result = f"WRONG: {wrong}"
    except TorchvisionMissing as missing:
        cell.result = f"skipped: {missing}"
    except Exception as error:
        cell.result = _refusal(error)
    cell.seconds = time.perf_counter() - start
    return cell


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
    """`executor.compile` (inductor, `COMPILE_OPTIONS`) at "min" and at `budget` on copies of
    one architecture's model, trained in lockstep with eager and with torch's own compiled step
    (``torch.compile`` with the same options); never raises. ``mid`` is midway between the
    "min" compile's measured peak and torch's own compiled step's (`plain_step_peak`, after
    its compile), the "min" compile's where torch's peaks lower (its partition is not remat's
    model: on small convolutional models it can); `time_limit` bounds each executor.compile
    call. A cell is ``close`` where every value is within `tolerance` of eager's, ``as
    torch.compile`` where a value is not but torch's own compiled step is nearly as far from
    eager's on it, WRONG where `tolerance` says so; each reports remat's largest distance and
    torch's. The first cell's seconds
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


def row_runtimes(runtimes: Sequence[str], budget: str) -> list[str]:
    """A row's cells in order: the control, then each of `runtimes` (``compile``: its two)."""
    names = ["eager"] + [r for r in RUNTIMES[1:] if r in runtimes]
    return names + (list(compile_runtimes(budget)) if "compile" in runtimes else [])


def row_cells(
    name: str,
    budget: str,
    steps: int,
    time_limit: float,
    runtimes: Sequence[str] = (*RUNTIMES, "compile"),
    compile_time_limit: float = 240,
    tolerance: CompileTolerance = CompileTolerance(),
) -> Iterator[Cell]:
    """The control, then each of `runtimes`, on one architecture, in this process, one
    thread."""
    torch.set_num_threads(1)
    control = run_cell(name, "eager", budget, steps, time_limit)
    yield control
    for runtime in RUNTIMES[1:]:
        if runtime in runtimes:
            yield run_cell(name, runtime, budget, steps, time_limit, control.differs_at)
    if "compile" in runtimes:
        yield from compile_cells(
            name, budget, steps, compile_time_limit, tolerance, control.differs_at
        )


def run_row(
    name: str,
    budget: str = "mid",
    steps: int = 3,
    time_limit: float = 10,
    runtimes: Sequence[str] = RUNTIMES,
    compile_time_limit: float = 240,
) -> list[Cell]:
    """The control and `runtimes` (default: the bit-for-bit ones) on one architecture, in this
    process."""
    return list(row_cells(name, budget, steps, time_limit, runtimes, compile_time_limit))


def _worker(args: argparse.Namespace) -> int:
    """One architecture's row: each cell printed as a JSON line when it ends."""
    cells = row_cells(
        args.worker,
        args.budget,
        args.steps,
        args.time_limit,
        args.runtimes,
        args.compile_time_limit,
        CompileTolerance(args.rtol, args.floor, args.factor),
    )
    for cell in cells:
        print("CELL " + json.dumps(asdict(cell)), flush=True)
    return 0


def run_subprocess(name: str, args: argparse.Namespace) -> list[Cell]:
    """One architecture's row in a subprocess under `args.row_timeout` seconds; a cell it did
    not report (a timeout or a crash) is refused with the reason."""
    command = [sys.executable, "-m", "benchmarks.running.breadth", "--worker", name]
    command += ["--budget", args.budget, "--steps", str(args.steps)]
    command += ["--time-limit", str(args.time_limit), "--runtimes", *args.runtimes]
    command += ["--compile-time-limit", str(args.compile_time_limit)]
    command += ["--rtol", str(args.rtol), "--floor", str(args.floor)]
    command += ["--factor", str(args.factor)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.row_timeout)
        out, reason = done.stdout, f"refused: crashed: exit status {done.returncode}"
        tail = done.stderr.strip().splitlines()[-1:] if done.returncode else []
        reason += f": {tail[0]}" if tail else ""
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        reason = f"refused: timeout: no result within {args.row_timeout:g} s"
    cells = [
        Cell(**json.loads(line[5:]))
        for line in (out or "").splitlines()
        if line.startswith("CELL ")
    ]
    seconds = time.perf_counter() - start - sum(c.seconds for c in cells)
    family = ARCHITECTURES[name][0]
    for runtime in row_runtimes(args.runtimes, args.budget)[len(cells) :]:
        cells.append(Cell(name, family, runtime, reason, seconds=seconds))
        seconds = 0.0
    return cells


def table(cells: Sequence[Cell]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "\n".join(cell.markdown() for cell in cells) + "\n"


def summary(cells: Sequence[Cell]) -> str:
    """Cells per result; equal runtime cells whose schedule or plan checkpoints nothing (so that
    they test little) are counted apart."""
    counts = {k: sum(c.result.startswith(k) for c in cells) for k in KINDS}
    idle = sum(c.result == "equal" and c.checkpointed.startswith("0 ") for c in cells)
    parts = [f"{n} {k}" for k, n in counts.items() if n]
    if idle:
        parts[0] += f" ({idle} of them checkpointing nothing)"
    return ", ".join(parts) + f" of {len(cells)} cells"


def report(cells: Sequence[Cell], command: str) -> str:
    """The markdown report: the command, the summary, the table."""
    return f"`{command}`: {summary(cells)}\n\n{table(cells)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.running.breadth", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=list(ARCHITECTURES),
        help="these architectures (default: all)",
    )
    parser.add_argument(
        "--budget", default="mid", help="mid (default), bytes, 60%%, min: see the module docstring"
    )
    parser.add_argument("--steps", type=int, default=3, help="compared training steps (default 3)")
    parser.add_argument(
        "--time-limit", type=float, default=10, help="seconds per solve (default 10)"
    )
    parser.add_argument(
        "--row-timeout", type=float, default=1800, help="seconds per architecture (default 1800)"
    )
    parser.add_argument(
        "--runtimes",
        nargs="+",
        choices=[*RUNTIMES[1:], "compile"],
        default=[*RUNTIMES[1:], "compile"],
        help="runtimes besides the eager control (default: all; compile: its two cells)",
    )
    parser.add_argument(
        "--compile-time-limit",
        type=float,
        default=240,
        help="seconds per executor.compile call (default 240)",
    )
    parser.add_argument(
        "--rtol", type=float, default=CompileTolerance.rtol, help="compile cells' tolerance"
    )
    parser.add_argument(
        "--floor", type=float, default=CompileTolerance.floor, help="compile cells' scale floor"
    )
    parser.add_argument(
        "--factor",
        type=float,
        default=CompileTolerance.factor,
        help="WRONG only this many times farther from eager than torch.compile (default 10)",
    )
    parser.add_argument("--out", type=Path, help="write the markdown table here")
    parser.add_argument("--json", type=Path, help="write the cells as JSON here")
    parser.add_argument("--worker", choices=list(ARCHITECTURES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.worker:
        return _worker(args)
    cells: list[Cell] = []
    command = "python -m benchmarks.running.breadth " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print("| " + " | ".join(COLUMNS) + " |", flush=True)
    for name in args.only or ARCHITECTURES:
        for cell in run_subprocess(name, args):
            cells.append(cell)
            print(cell.markdown(), flush=True)
        # after each row: a long run that is stopped leaves the rows done so far
        if args.out:
            args.out.write_text(report(cells, command.strip()))
        if args.json:
            args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    print("\n" + report(cells, command.strip()))
    return 1 if any(c.result.startswith("WRONG") for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
