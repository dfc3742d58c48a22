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

The compile cells are not bit for bit: `benchmarks.running.breadth_compile` says how they are
compared and judged. This module holds the bit-for-bit runtimes (`BUILD`, `run_cell`) and the
driver (one subprocess per architecture); the step and its comparison are in
`benchmarks.running.breadth_steps`, the cell, table and summary in
`benchmarks.running.breadth_report`.


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
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.running.breadth_compile import CompileTolerance, compile_cells, compile_runtimes
from benchmarks.running.breadth_models import ARCHITECTURES, Case, TorchvisionMissing, hf_loss
from benchmarks.running.breadth_report import COLUMNS, Cell, _refusal, report
from benchmarks.running.breadth_steps import (
    EVALUATIONS,
    LR,
    evaluate,
    first_difference,
    measured_peak,
    train_step,
)

RUNTIMES = ("eager", "remat", "sac")
"""``eager``: the control, a second copy trained plainly against the first."""


class Mismatch(Exception):
    """The runtime's step differs from eager's at step `step`."""

    def __init__(self, difference: str, step: int) -> None:
        super().__init__(f"{difference} at step {step}")
        self.step = step


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
    captured = capture(
        case.model, case.inputs, example_kwargs=case.kwargs, **_capture_options(case)
    )
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
