"""Breadth: third-party architectures (HuggingFace transformers, torchvision; small configs,
random init, dropout on) trained in both runtimes against eager on an identical copy.

    python -m benchmarks.breadth                        # every architecture, both runtimes
    python -m benchmarks.breadth --only gpt2 tv_resnet18 --steps 3 --out breadth.md --json b.json

Per architecture (`benchmarks.breadth_models`) and runtime:

- ``remat``: remat's own executor (`executor.rematerialize`; HF models captured with
  ``backward_from=["loss"]``);
- ``sac``: a SAC plan (`executor.checkpoint_plan`, `CheckpointPlan.apply`).

The model is copied (`copy.deepcopy`) before anything runs; the runtime is built on the model
itself, then both train ``--steps`` SGD steps, each step from the same seed, one thread. After
every step, compared with `torch.equal`: the loss, every parameter's ``.grad``, every buffer
(BatchNorm running statistics and ``num_batches_tracked``) and every parameter after the SGD
step. Then one more step of the runtime is measured (`executor.measure_peak`: profiler
allocation events, bytes above the step's start) the way each runtime states its budget: the
own executor with ``.grad`` allocated before the step (`remat run`), the SAC plan with ``.grad``
set to None before it (`remat sac`).

The budget (``--budget``, default ``mid``): ``mid`` is midway between the least peak found and
100%: for the own executor between `solver.minimum_peak` and the checkpoint-all peak, for SAC
between the plan at ``"min"`` (its predicted peak) and the step without checkpointing. Any other
value goes to both APIs as it is (bytes, ``"60%"``, ``"min"``). The two runtimes' 100% differ
(checkpoint-all against the plain step), so their budgets differ in bytes.

Each cell is one of ``equal`` (bit-identical on every step and measured peak within the budget),
``WRONG: <tensor> differs at step k`` (exit status 1), ``over budget`` or ``refused: <error>``
(the exception's type and first line). Each architecture runs in its own subprocess under
``--row-timeout`` seconds; a failure there is recorded and the others go on. ``seconds`` is
the cell's wall time: planning, the eager and runtime steps and the measured step.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from benchmarks.breadth_models import ARCHITECTURES, Case, TorchvisionMissing, hf_loss

RUNTIMES = ("remat", "sac")
SEED = 1234
LR = 0.01
COLUMNS = ("architecture", "family", "runtime", "result", "measured peak", "budget", "seconds")


@dataclass
class Cell:
    """One architecture in one runtime: the result and its numbers (bytes, seconds)."""

    architecture: str
    family: str
    runtime: str
    result: str
    peak: int | None = None
    budget: int | None = None
    seconds: float = 0.0

    def markdown(self) -> str:
        values = (
            self.architecture,
            self.family,
            self.runtime,
            self.result.replace("|", "\\|"),
            _mib(self.peak),
            _mib(self.budget),
            f"{self.seconds:.1f}",
        )
        return "| " + " | ".join(values) + " |"


class Mismatch(Exception):
    """The runtime's step differs from eager's."""


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f} MiB"


def _refusal(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"refused: {type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


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


def first_difference(want: dict, got: dict) -> str | None:
    """The first tensor of `want` that `got` does not hold bit for bit, with how many more
    differ; None when all are equal."""
    differ = []
    for key, a in want.items():
        b = got.get(key, "missing")
        same = (a is None and b is None) or (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        )
        if not same:
            differ.append(key)
    differ += [key for key in got if key not in want]
    if not differ:
        return None
    more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
    return f"{differ[0]} differs{more}"


def _capture_options(case: Case) -> dict:
    return {"repeats": 1, **({"backward_from": ["loss"]} if case.loss_fn is hf_loss else {})}


def own_executor(case: Case, budget: str, time_limit: float) -> tuple[nn.Module, int]:
    """remat's own executor on `case.model` at `budget`; (the module to call, budget bytes)."""
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
        return rm, rm.schedule.budget
    captured = capture(case.model, case.inputs, case.kwargs, **_capture_options(case))
    least = solver.minimum_peak(captured.dag, time_limit=time_limit).peak
    full = solver.checkpoint_all_peak(solver.prepare(captured.dag))
    schedule = solver.solve(captured.dag, budget=(least + full) // 2, time_limit=time_limit)
    return executor.Rematerialized(case.model, captured, schedule), schedule.budget


def sac_plan(case: Case, budget: str, time_limit: float) -> tuple[nn.Module, int]:
    """A SAC plan applied to `case.model` at `budget`; (the model, budget bytes)."""
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
    return plan.apply(case.model), plan.budget


BUILD = {"remat": own_executor, "sac": sac_plan}


def measured_peak(module: Callable, model: nn.Module, case: Case, runtime: str) -> int:
    """The measured peak (bytes above the step's start) of one step of `module`, `.grad`
    allocated before it for the own executor and set to None for SAC; RNG restored after."""
    from executor import measure_peak

    model.zero_grad(set_to_none=runtime == "sac")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return measure_peak(
            lambda: case.loss_fn(module(*case.inputs, **case.kwargs)).backward()
        ).peak_bytes


def run_cell(name: str, runtime: str, budget: str, steps: int, time_limit: float) -> Cell:
    """One architecture in one runtime against eager; never raises."""
    family, make = ARCHITECTURES[name]
    cell = Cell(name, family, runtime, "")
    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        case = make()
        eager = copy.deepcopy(case.model)
        module, cell.budget = BUILD[runtime](case, budget, time_limit)
        runs = [(eager, eager), (module, case.model)]
        opts = [torch.optim.SGD(model.parameters(), lr=LR) for _, model in runs]
        for step in range(steps):
            want, got = (
                train_step(call, model, case, opt, step)
                for (call, model), opt in zip(runs, opts, strict=True)
            )
            difference = first_difference(want, got)
            if difference:
                raise Mismatch(f"WRONG: {difference} at step {step}")
        cell.peak = measured_peak(module, case.model, case, runtime)
        cell.result = "equal" if cell.peak <= cell.budget else "over budget"
    except Mismatch as wrong:
        cell.result = str(wrong)
    except TorchvisionMissing as missing:
        cell.result = f"skipped: {missing}"
    except Exception as error:
        cell.result = _refusal(error)
    cell.seconds = time.perf_counter() - start
    return cell


def run_row(name: str, budget: str = "mid", steps: int = 3, time_limit: float = 10) -> list[Cell]:
    """Both runtimes on one architecture, in this process."""
    torch.set_num_threads(1)
    return [run_cell(name, runtime, budget, steps, time_limit) for runtime in RUNTIMES]


def _worker(args: argparse.Namespace) -> int:
    """One architecture's row: each cell printed as a JSON line when it ends."""
    torch.set_num_threads(1)
    for runtime in RUNTIMES:
        cell = run_cell(args.worker, runtime, args.budget, args.steps, args.time_limit)
        print("CELL " + json.dumps(asdict(cell)), flush=True)
    return 0


def run_subprocess(name: str, args: argparse.Namespace) -> list[Cell]:
    """One architecture's row in a subprocess under `args.row_timeout` seconds; a cell it did
    not report (a timeout or a crash) is refused with the reason."""
    command = [sys.executable, "-m", "benchmarks.breadth", "--worker", name]
    command += ["--budget", args.budget, "--steps", str(args.steps)]
    command += ["--time-limit", str(args.time_limit)]
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
    for runtime in RUNTIMES[len(cells) :]:
        cells.append(Cell(name, family, runtime, reason, seconds=seconds))
        seconds = 0.0
    return cells


def table(cells: Sequence[Cell]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "\n".join(cell.markdown() for cell in cells) + "\n"


def summary(cells: Sequence[Cell]) -> str:
    kinds = ("equal", "WRONG", "over budget", "refused", "skipped")
    counts = {k: sum(c.result.startswith(k) for c in cells) for k in kinds}
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" of {len(cells)} cells"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.breadth", description=__doc__.split("\n")[0]
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
        "--row-timeout", type=float, default=900, help="seconds per architecture (default 900)"
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
    print("| " + " | ".join(COLUMNS) + " |", flush=True)
    for name in args.only or ARCHITECTURES:
        for cell in run_subprocess(name, args):
            cells.append(cell)
            print(cell.markdown(), flush=True)
    command = "python -m benchmarks.breadth " + " ".join(argv if argv is not None else sys.argv[1:])
    report = f"`{command.strip()}`: {summary(cells)}\n\n{table(cells)}"
    print("\n" + report)
    if args.out:
        args.out.write_text(report)
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    return 1 if any(c.result.startswith("WRONG") for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
