"""The memory/compute frontier of one model, predicted and measured, with the users' options.

Predicted (solver model): the exact solver and every baseline (rotor on chains) from the
checkpoint-all peak down to the least peak the exact solver finds (objective "memory").
Measured (one process, side by side, median of repeats): plain eager, remat's executor under
checkpoint-all, sqrt(n) and the exact schedule; torch.utils.checkpoint on every block;
PyTorch's activation_memory_budget knapsack.
For each torch option the exact schedule is solved so that its measured peak should match the
option's (budget = the option's measured peak: capture's transients make remat's predicted peak
its measured one), falling back to the same fraction of the checkpoint-all peak as the
option's measured saving over plain eager, and when the solver finds no schedule at either within
its time limit, to the least-peak schedule it found; the row's `matched` says which.

Run: python -m benchmarks.solving.frontier --model gpt [--quick] [--out results]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import solver
from benchmarks.common import (
    Row,
    Settings,
    budget_ladder,
    exact_row,
    min_peak_row,
    plot_frontier,
    predicted_frontier,
    write_table,
)
from benchmarks.models import MODELS
from benchmarks.running.measure import Step, knapsack_forward, loss_step, measure
from benchmarks.zoo import Bench
from executor.traced.module import Rematerialized
from graph_capture import CapturedGraph, capture


def _remat_step(bench: Bench, captured: CapturedGraph, schedule: solver.Schedule) -> Step:
    return loss_step(Rematerialized(bench.model, captured, schedule), bench.inputs)


def _peer_steps(bench: Bench, settings: Settings) -> tuple[dict[str, Step], list[Row]]:
    """The users' options: torch.utils.checkpoint per block and the knapsack at a few budgets;
    rows noting any option that could not be built or run."""
    steps: dict[str, Step] = {}
    failed: list[Row] = []
    if bench.blocks:
        steps["torch.utils.checkpoint per block"] = loss_step(
            bench.model, bench.inputs, bench.blocks
        )
    for budget in (0.5,) if settings.quick else (0.8, 0.5, 0.2):
        label = f"torch knapsack budget={budget}"
        try:
            step = loss_step(knapsack_forward(bench.model, budget), bench.inputs)
            step()  # compiles; fails here when the partitioner cannot handle the model
            steps[label] = step
        except Exception as error:  # report, not crash: torch internals vary between versions
            failed.append({"method": label, "note": f"failed: {type(error).__name__}"})
    return steps, failed


def measured_rows(
    name: str,
    bench: Bench,
    captured: CapturedGraph,
    least_peak: solver.Schedule,
    settings: Settings,
) -> list[Row]:
    """Measured peak and step time of every option on `name`, side by side (one `measure`
    call), with ratios to plain eager. Exact schedules are matched to each torch option's
    measured peak (see the module docstring)."""
    graph = captured.dag
    problem = solver.prepare(graph)
    full_peak = solver.checkpoint_all_peak(problem)
    schedules = {
        f"remat {m}": solver.baseline(graph, m) for m in ("checkpoint_all", "sqrt_segments")
    }
    peers, rows = _peer_steps(bench, settings)
    steps = {"eager (plain)": loss_step(bench.model, bench.inputs), **peers}
    steps["remat checkpoint_all"] = _remat_step(bench, captured, schedules["remat checkpoint_all"])
    first = measure(steps, repeats=0)
    solved: dict[str, Row] = {}
    for label in peers:
        peer_bytes = first[label]["peak_MiB"] * 2**20
        plain_bytes = first["eager (plain)"]["peak_MiB"] * 2**20
        targets = (
            ("same measured peak", int(peer_bytes)),
            ("same saving", int(full_peak * peer_bytes / plain_bytes)),
        )
        key = f"remat exact @ {label}"
        for matched, target in targets:
            if target < problem.memory_lower_bound:
                continue
            found, schedule = exact_row(graph, target, settings)
            if schedule is not None:
                schedules[key] = schedule
                solved[key] = {"matched": matched, "status": found["status"], "gap": found["gap"]}
                break
        else:
            schedules[key] = least_peak
            solved[key] = {"matched": "least peak found", "status": least_peak.status}
    for key, schedule in schedules.items():
        steps[key] = _remat_step(bench, captured, schedule)
    results = measure(steps, settings.repeats)
    plain = results["eager (plain)"]
    for key, measured in results.items():
        row: Row = {"method": key, **measured}
        row["peak_vs_eager"] = measured["peak_MiB"] / plain["peak_MiB"]
        row["time_vs_eager"] = measured["step_ms"] / plain["step_ms"]
        if key in schedules:
            row["predicted_frac"] = schedules[key].peak / full_peak
            row["predicted_overhead"] = schedules[key].cost / problem.total_cost - 1
        rows.append({**row, **solved.get(key, {})})
    return [{"model": name, **row} for row in rows]


def run_model(name: str, settings: Settings) -> tuple[list[Row], list[Row]]:
    """Predicted frontier and measured rows for one model; writes frontier_<name>.{csv,md,png}
    and measured_<name>.{csv,md}. A model that fails to build or capture gives one row saying
    why (e.g. transformers not installed)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        bench = MODELS[name]()
        captured = capture(bench.model, bench.inputs, granularity="module")
    except Exception as error:  # report the failure in the table, keep the other models
        row = {"model": name, "method": "-", "note": f"{type(error).__name__}: {error}"[:200]}
        return [], [row]
    problem = solver.prepare(captured.dag)
    low, least_peak = min_peak_row(captured.dag, settings, name)
    ladder = budget_ladder(float(low["peak_frac"]), 4 if settings.quick else 6)
    predicted = [*predicted_frontier(captured.dag, ladder, settings, name), low]
    write_table(predicted, settings.out, f"frontier_{name}", f"{name}: predicted frontier")
    plot_frontier(predicted, settings.out / f"frontier_{name}.png", f"{name} ({problem.n} nodes)")
    measured = measured_rows(name, bench, captured, least_peak, settings)
    for row in measured:
        row["nodes"] = problem.n
    write_table(measured, settings.out, f"measured_{name}", f"{name}: measured")
    print(f"{name}: {time.perf_counter() - start:.0f} s")
    return predicted, measured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    run_model(args.model, Settings(args.out, quick=args.quick, time_limit=3 if args.quick else 10))


if __name__ == "__main__":
    main()
