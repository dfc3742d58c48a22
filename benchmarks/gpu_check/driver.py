"""The driver: `main` (the command line), the structure step (`structure`: the CUDA-only tests,
``pytest -m "cuda and not long"``), each model in its own subprocess (`run_model`), which runs
`_worker` and reports its cells as ``CELL <json>`` lines."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.gpu_check.cells import model_cells
from benchmarks.gpu_check.reporting import describe, measure_link, report, row
from benchmarks.gpu_check.spec import (
    DEFAULT_COMPILE_MODELS,
    DEFAULT_MODELS,
    DETERMINISM_ENV,
    MODELS,
    RUN_LIMITS,
    RUNTIMES,
    STRUCTURE_TESTS,
    Cell,
    Run,
    compile_backend,
    deterministic,
    model_budget,
    run_budget,
)
from benchmarks.running.compile_partition import ignore_hf_logging

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root: the structure step's pytest runs there."""


def _worker(args: argparse.Namespace) -> int:
    os.environ.update(DETERMINISM_ENV)  # set by `run_model` before torch's import; kept here
    deterministic()
    if args.device == "cpu":
        torch.set_num_threads(1)
    spec = MODELS[args.worker]
    torch.manual_seed(0)

    run = Run(
        args.worker,
        spec.bench(args.quick),
        torch.device(args.device),
        args.link,
        compile_backend(args.device),
        args.steps,
        args.limit_scale,
        compiles=args.worker in args.compile_models,
    )
    ignore_hf_logging()
    for cell in model_cells(run):
        print("CELL " + json.dumps(asdict(cell)), flush=True)
    return 0


def run_model(name: str, args: argparse.Namespace) -> list[Cell]:
    """One model's cells, in a subprocess under its limits and `DETERMINISM_ENV`; a cell it
    did not report (a crash, a hang) is refused with the reason."""
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--worker", name]
    command += ["--device", args.device, "--link", args.link]
    command += ["--steps", str(args.steps), "--limit-scale", str(args.limit_scale)]
    command += ["--compile-models", *args.compile_models]
    command += ["--quick"] if args.quick else []
    timeout = model_budget(args.limit_scale, name in args.compile_models)
    env = {**os.environ, **DETERMINISM_ENV}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        out = done.stdout
        tail = done.stderr.strip().splitlines()[-1:] if done.returncode else []
        reason = f"refused: the worker exited with status {done.returncode}"
        reason += f": {tail[0]}" if tail else ""
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        reason = f"refused: the model's worker ran past {timeout:g} s"
    lines = (out or "").splitlines()
    cells = [Cell(**json.loads(line[5:])) for line in lines if line.startswith("CELL ")]
    reported = {c.runtime for c in cells}
    cells += [Cell(name, r, reason) for r in RUNTIMES if r not in reported]
    return cells


def structure(args: argparse.Namespace) -> tuple[str, bool]:
    """``pytest -m STRUCTURE_TESTS`` (the tests of the CUDA paths but the long ones) on the
    device, under its limit: (one line: passed, failed and skipped counts, the first failure;
    or why it did not run, whether it failed)."""
    if args.device != "cuda":
        return "not run: --device cpu (the `cuda` tests skip without a CUDA device)", False
    limit = RUN_LIMITS["structure"] * args.limit_scale
    command = [sys.executable, "-m", "pytest", "-m", STRUCTURE_TESTS, "-q", "-rf"]
    command += ["-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            [*command, "tests"], capture_output=True, text=True, timeout=limit, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return f"`pytest -m '{STRUCTURE_TESTS}'` ran past its limit of {limit:g} s", True
    return pytest_summary(done.stdout, done.returncode)


def pytest_summary(out: str, returncode: int) -> tuple[str, bool]:
    """(passed, failed and skipped counts of a ``pytest -q -rf`` run's output, with its first
    failure; whether it failed). Exit status 5 (no test selected) is not a failure."""
    counts = dict.fromkeys(("passed", "failed", "skipped", "error"), 0)
    last = out.strip().splitlines()[-1:] or [""]  # the summary: "3 passed, 1 skipped in 2.0s"
    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", last[0]):
        counts[kind.rstrip("s") if kind.startswith("error") else kind] += int(n)
    line = (
        f"`pytest -m '{STRUCTURE_TESTS}'`: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped, {counts['error']} errors (exit status {returncode})"
    )
    first = next((x for x in out.splitlines() if x.startswith(("FAILED", "ERROR"))), None)
    failed = returncode not in (0, 5)
    return line + (f"; first: {first}" if first else ""), failed


def main(argv: Sequence[str] | None = None) -> int:
    summary = sys.modules[__package__].__doc__.split("\n")[0]  # the package's docstring
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=summary)
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu")
    parser.add_argument("--quick", action="store_true", help="small shapes (for the CPU)")
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), help=f"default: {' '.join(DEFAULT_MODELS)}"
    )
    parser.add_argument(
        "--compile-models",
        nargs="*",
        choices=list(MODELS),
        default=list(DEFAULT_COMPILE_MODELS),
        help="the models whose compile cells run (default: %(default)s; the others' are "
        "skipped: inductor compiles are the run's longest cells)",
    )
    parser.add_argument(
        "--link",
        default="measured",
        help="host link: 'measured' (default: measured on --device, saved as link.json in "
        "--out), a link or target name (h100, pcie5) or a device file",
    )
    parser.add_argument(
        "--target",
        default="h100",
        help="the device whose published figures the measured link is saved with and set "
        "beside on CUDA (default: %(default)s)",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell (median)")
    parser.add_argument("--limit-scale", type=float, default=1.0, help="times every limit")
    parser.add_argument(
        "--max-seconds", type=float, default=600, help="refuse runs whose limits add past this"
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="output folder")
    parser.add_argument("--worker", choices=list(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.device == "cuda" and not cuda:
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu --quick")
    if args.steps < 1 or args.limit_scale <= 0:
        parser.error("--steps must be at least 1 and --limit-scale positive")
    if args.worker:
        return _worker(args)
    args.models = args.models or list(DEFAULT_MODELS)
    most = run_budget(args.limit_scale, args.models, args.compile_models)
    if most > args.max_seconds:
        parser.error(
            f"the limits add up to {most:.0f} s, over --max-seconds {args.max_seconds:g}: "
            "lower --limit-scale, or run fewer --models or --compile-models"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    measured = measure_link(args) if args.link == "measured" else None
    checked, failed = structure(args)
    header = describe(args, measured, checked)
    if measured is not None:
        args.link = str(measured)  # the workers read the measured link by path
    print("\n".join(header), flush=True)
    cells: list[Cell] = []
    for name in args.models:
        for cell in run_model(name, args):
            cells.append(cell)
            print(row(cell), flush=True)
        (args.out / "gpu_check.md").write_text(report(cells, header))
        (args.out / "gpu_check.json").write_text(
            json.dumps({"header": header, "cells": [asdict(c) for c in cells]}, indent=1)
        )
    return 1 if failed or any(c.result.startswith("WRONG") for c in cells) else 0
