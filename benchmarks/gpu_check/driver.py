"""The driver: `main` (the command line), each model in its own subprocess (`run_model`), which
runs `_worker` and reports its cells as ``CELL <json>`` lines."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.gpu_check.cells import model_cells
from benchmarks.gpu_check.reporting import describe, measure_link, report, row
from benchmarks.gpu_check.spec import MODELS, RUNTIMES, Cell, Run, compile_backend, model_budget
from benchmarks.running.compile_partition import ignore_hf_logging


def _worker(args: argparse.Namespace) -> int:
    if args.device == "cpu":
        torch.set_num_threads(1)
    spec = MODELS[args.worker]
    torch.manual_seed(0)
    run = Run(
        args.worker,
        (spec.quick if args.quick else spec.full)(),
        torch.device(args.device),
        args.link,
        args.target if args.device == "cuda" else None,
        compile_backend(args.device),
        args.steps,
        args.limit_scale,
    )
    ignore_hf_logging()
    for cell in model_cells(run):
        print("CELL " + json.dumps(asdict(cell)), flush=True)
    return 0


def run_model(name: str, args: argparse.Namespace) -> list[Cell]:
    """One model's cells, in a subprocess under its limits; a cell it did not report (a crash,
    a hang) is refused with the reason."""
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--worker", name]
    command += ["--device", args.device, "--link", args.link, "--target", args.target]
    command += ["--steps", str(args.steps), "--limit-scale", str(args.limit_scale)]
    command += ["--quick"] if args.quick else []
    timeout = model_budget(args.limit_scale)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
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


def main(argv: Sequence[str] | None = None) -> int:
    summary = sys.modules[__package__].__doc__.split("\n")[0]  # the package's docstring
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=summary)
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu")
    parser.add_argument("--quick", action="store_true", help="small shapes (for the CPU)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), help="default: all")
    parser.add_argument(
        "--link",
        default="measured",
        help="host link: 'measured' (default: measured on --device, saved as link.json in "
        "--out), a link or target name (h100, pcie5) or a device file",
    )
    parser.add_argument("--target", default="h100", help="SAC's estimate target on CUDA")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell (median)")
    parser.add_argument("--limit-scale", type=float, default=1.0, help="times every limit")
    parser.add_argument("--max-seconds", type=float, default=570, help="refuse runs past this")
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
    models = args.models or list(MODELS)
    most = model_budget(args.limit_scale) * len(models)
    if most > args.max_seconds:
        parser.error(
            f"the phase limits add up to {most:.0f} s, over --max-seconds {args.max_seconds:g}: "
            "lower --limit-scale or run fewer --models"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    measured = measure_link(args) if args.link == "measured" else None
    header = describe(args, measured)
    if measured is not None:
        args.link = str(measured)  # the workers read the measured link by path
    print("\n".join(header), flush=True)
    cells: list[Cell] = []
    for name in models:
        for cell in run_model(name, args):
            cells.append(cell)
            print(row(cell), flush=True)
        (args.out / "gpu_check.md").write_text(report(cells, header))
        (args.out / "gpu_check.json").write_text(
            json.dumps({"header": header, "cells": [asdict(c) for c in cells]}, indent=1)
        )
    return 1 if any(c.result.startswith("WRONG") for c in cells) else 0
