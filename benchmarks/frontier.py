"""The memory/compute frontier of one model, predicted and measured, with the users' options.

Predicted (solver model): the exact solver and every baseline (rotor on chains) from the
checkpoint-all peak down to the one-line lower bound. Measured (one process, side by side,
median of repeats): plain eager, remat's executor under checkpoint-all, sqrt(n) and the exact
schedule; torch.utils.checkpoint on every block; PyTorch's activation_memory_budget knapsack.
For each torch option the exact schedule is solved at the same fraction of the checkpoint-all
peak as that option's measured saving over plain eager, and measured next to it.

Run: python -m benchmarks.frontier --model gpt [--quick] [--out results]
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
    plot_frontier,
    predicted_frontier,
    write_table,
)
from benchmarks.measure import checkpointed_blocks, knapsack_forward, loss_step, measure
from benchmarks.models import MODELS, Bench
from executor.module import Rematerialized
from graph_capture import capture


def _remat_row(bench: Bench, captured, schedule, settings: Settings) -> dict[str, float]:
    executor = Rematerialized(bench.model, captured, schedule)
    return measure(loss_step(executor, bench.inputs), settings.repeats)


def measured_rows(name: str, bench: Bench, captured, settings: Settings) -> list[Row]:
    """Measured peak and step time of every option on `name`, ratios to plain eager."""
    graph = captured.dag
    problem = solver.prepare(graph)
    full_peak = solver.checkpoint_all_peak(problem)
    rows: list[Row] = []

    def add(method: str, measured: dict[str, float], **extra: object) -> None:
        rows.append({"model": name, "method": method, **measured, **extra})

    plain = measure(loss_step(bench.model, bench.inputs), settings.repeats)
    add("eager (plain)", plain)
    for method in ("checkpoint_all", "sqrt_segments"):
        schedule = solver.baseline(graph, method)
        add(
            f"remat {method}",
            _remat_row(bench, captured, schedule, settings),
            predicted_frac=schedule.peak / full_peak,
            predicted_overhead=schedule.cost / problem.total_cost - 1,
        )
    peers: list[tuple[str, dict[str, float]]] = []
    if bench.blocks:
        with checkpointed_blocks(bench.blocks):
            peers.append(
                (
                    "torch.utils.checkpoint per block",
                    measure(loss_step(bench.model, bench.inputs), settings.repeats),
                )
            )
    for budget in (0.5,) if settings.quick else (0.8, 0.5, 0.2):
        try:
            forward = knapsack_forward(bench.model, budget)
            peers.append(
                (
                    f"torch knapsack budget={budget}",
                    measure(loss_step(forward, bench.inputs), settings.repeats),
                )
            )
        except Exception as error:  # report, not crash: torch internals vary between versions
            add(f"torch knapsack budget={budget}", {}, note=f"failed: {type(error).__name__}")
    for label, measured in peers:
        add(label, measured)
        saving = measured["peak_MiB"] / plain["peak_MiB"]
        target = max(problem.memory_lower_bound, int(full_peak * saving))
        found, schedule = exact_row(graph, target, settings)
        if schedule is None:
            add(f"remat exact @ {label}", {}, note=found["status"])
            continue
        add(
            f"remat exact @ {label}",
            _remat_row(bench, captured, schedule, settings),
            predicted_frac=schedule.peak / full_peak,
            predicted_overhead=schedule.cost / problem.total_cost - 1,
            status=found["status"],
            gap=found.get("gap"),
        )
    for row in rows:
        if "peak_MiB" in row:
            row["peak_vs_eager"] = row["peak_MiB"] / plain["peak_MiB"]
            row["time_vs_eager"] = row["step_ms"] / plain["step_ms"]
    return rows


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
    ladder = budget_ladder(problem, 4 if settings.quick else 7)
    predicted = predicted_frontier(captured.dag, ladder, settings, name)
    write_table(predicted, settings.out, f"frontier_{name}", f"{name}: predicted frontier")
    plot_frontier(predicted, settings.out / f"frontier_{name}.png", f"{name} ({problem.n} nodes)")
    measured = measured_rows(name, bench, captured, settings)
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
    run_model(args.model, Settings(args.out, quick=args.quick, time_limit=3 if args.quick else 15))


if __name__ == "__main__":
    main()
