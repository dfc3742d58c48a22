"""Real models side by side at equal measured memory: remat's schedule against torch's options.

    python -m benchmarks.running.real_models [--models gpt2_4 resnet18 ...] [--rounds 30]
                                     [--time-limit 30] [--out results/real_models]

For each zoo model (`benchmarks.zoo`; one thread): measure one training step's peak (profiler
allocation events, bytes above the start of the step, ``.grad`` allocated before it) of

- eager autograd;
- per-block ``torch.utils.checkpoint`` (non-reentrant) over the model's blocks;
- ``checkpoint_sequential``'s partition of the blocks into round(sqrt(n)) segments;
- torch's ``activation_memory_budget`` knapsack (min-cut partitioner through aot_function, no
  inductor) at each ``--knapsack`` budget, where it runs;

then solve remat's schedule with each of those measured peaks as its byte budget (and at 100%,
no recomputation), measure remat's peak (it must be at or under the budget) and time every
method in interleaved rounds (one step of each per round, the order rotated; medians).

Per remat row: the predicted peak and measured / predicted; the predicted recompute (schedule
cost / cost of computing each node once - 1), the predicted overhead (`solver.Problem.overhead`:
the recomputation over capture's measured plain step, `step_cost`) and the measured one: the
step time over remat's 100% step in rounds of those two steps alone (``measured_overhead``,
with a 95% bootstrap interval of that median, ``measured_overhead_low`` / ``_high``; rounds
are added ``--rounds`` at a time, up to ``--max-overhead-rounds``, until that interval is at
most a tenth of the overhead (or one point) wide, ``overhead_rounds`` taken; a second copy of
the 100% step measures its noise floor), and in the rounds of every method
(``overhead_among_all``: there the steps between the two change the caches and the allocator's
state they start from); the step time over the matched method's, in the rounds of every method
(``time_vs_matched``) and in rounds of those two steps alone (``time_vs_matched_alone``). Writes
``real_models.{md,csv,png}`` and ``summary.md`` (one row per model) under ``--out``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import solver
from benchmarks.common import Row, write_table
from benchmarks.running.measure import (
    Step,
    interleaved_times,
    knapsack_forward,
    loss_step,
    measure_peaks,
)
from benchmarks.zoo import ZOO, Bench
from executor.traced.module import Rematerialized
from graph_capture import capture

MODELS = (
    "gpt2_4",
    "gpt2_12",
    "llama_4",
    "llama_12",
    "bert_4",
    "bert_12",
    "vit_4",
    "vit_12",
    "resnet18",
    "resnet50",
    "mobilenet_v3_small",
)
PER_BLOCK = "checkpoint per block"
SQRT = "checkpoint_sequential sqrt(n)"
REMAT_FULL = "remat 100%"
CONTROL = "remat 100% again"
"""A second copy of the 100% step: its measured overhead over the first (0 but for noise)
is the noise floor of the run's measured overheads."""


def _peers(bench: Bench, knapsack: tuple[float, ...]) -> tuple[dict[str, Step], dict[str, str]]:
    """Eager and torch's options on `bench`; (steps by name, failures by name)."""
    model, inputs, blocks = bench.model, bench.inputs, bench.blocks
    steps: dict[str, Step] = {"eager": loss_step(model, inputs)}
    failed: dict[str, str] = {}
    if blocks:
        steps[PER_BLOCK] = loss_step(model, inputs, blocks)
        steps[SQRT] = loss_step(model, inputs, blocks, max(1, round(math.sqrt(len(blocks)))))
    for budget in knapsack:
        name = f"knapsack {budget}"
        try:
            step = loss_step(knapsack_forward(model, budget), inputs)
            step()  # compiles; fails here when the partitioner cannot handle the model
            steps[name] = step
        except Exception as error:  # report, not crash: torch internals vary between versions
            failed[name] = f"{type(error).__name__}: {error}"[:120]
    return steps, failed


def _remat_step(bench: Bench, captured, schedule: solver.Schedule) -> Step:
    return loss_step(Rematerialized(bench.model, captured, schedule), bench.inputs)


def run_model(name: str, args: argparse.Namespace) -> list[Row]:
    """Every method's row on model `name` (see the module docstring)."""
    torch.set_num_threads(1)
    torch._dynamo.reset()  # the knapsack compiles HFLoss.forward anew per model (recompile limit)
    started = time.perf_counter()
    bench = ZOO[name]()
    for p in bench.model.parameters():
        p.grad = torch.zeros_like(p)
    captured = capture(bench.model, bench.inputs)
    graph = captured.dag
    problem = solver.prepare(graph)
    peers, failed = _peers(bench, tuple(args.knapsack))
    peaks = measure_peaks(peers)
    full = solver.baseline(graph, "checkpoint_all")
    schedules: dict[str, solver.Schedule] = {REMAT_FULL: full, CONTROL: full}
    budgets: dict[str, int] = {}
    for peer in peers:
        if peer == "eager":
            continue
        try:
            schedule = solver.solve(graph, budget=peaks[peer], time_limit=args.time_limit)
        except solver.RematError as error:
            failed[f"remat @ {peer}"] = str(error)[:120]
            continue
        schedules[f"remat @ {peer}"] = schedule
        budgets[f"remat @ {peer}"] = peaks[peer]
    steps = dict(peers)
    steps.update({key: _remat_step(bench, captured, s) for key, s in schedules.items()})
    peaks.update(measure_peaks({key: steps[key] for key in schedules}))
    times = interleaved_times(steps, args.rounds)
    alone = {
        key: rounds_until_resolved(steps, key, args.rounds, args.max_overhead_rounds)
        for key in schedules
        if key != REMAT_FULL
    }
    versus = {
        key: interleaved_times({key: steps[key], peer: steps[peer]}, args.rounds)
        for key in schedules
        if (peer := key.removeprefix("remat @ ")) in peers
    }
    rows = [
        _row(name, key, peaks, times, alone, versus, schedules, budgets, problem) for key in steps
    ]
    rows += [{"model": name, "method": key, "note": note} for key, note in failed.items()]
    print(f"{name}: {problem.n} nodes, {time.perf_counter() - started:.0f} s")
    return rows


def _paired(times: dict[str, list[float]], key: str, other: str) -> float:
    """Median over rounds of key's step time over other's in the same round."""
    return statistics.median(_ratios(times, key, other))


def _ratios(times: dict[str, list[float]], key: str, other: str) -> list[float]:
    """Per round, key's step time over other's in that round."""
    return [a / b for a, b in zip(times[key], times[other], strict=True)]


def rounds_until_resolved(
    steps: dict[str, Step],
    key: str,
    rounds: int,
    max_rounds: int,
    timer: Callable[[dict[str, Step], int], dict[str, list[float]]] = interleaved_times,
) -> dict[str, list[float]]:
    """Interleaved rounds of `key`'s step and remat's 100% step alone, `rounds` at a time until
    the 95% interval of the median overhead (`median_interval`) is `resolved` or `max_rounds`
    rounds are taken: a burst of load from other processes widens the interval, and more
    rounds then settle the median instead of leaving it to the burst. `timer` times a block of
    rounds (seconds per step and round; `interleaved_times`)."""
    pair = {REMAT_FULL: steps[REMAT_FULL], key: steps[key]}
    times = timer(pair, rounds)
    while len(times[key]) + rounds <= max_rounds:
        if resolved(*median_interval(_ratios(times, key, REMAT_FULL))):
            break
        for name, more in timer(pair, rounds).items():
            times[name] += more
    return times


def resolved(low: float, high: float, relative: float = 0.1, absolute: float = 0.01) -> bool:
    """Whether an interval (`low`, `high`) of a step-time ratio pins the overhead (ratio - 1)
    down: its width is at most `relative` of the overhead at its middle, or `absolute` (one
    point of overhead; a 2% overhead cannot be pinned to a tenth of itself by timing)."""
    middle = (low + high) / 2 - 1
    return high - low <= max(relative * abs(middle), absolute)


def median_interval(
    samples: list[float], level: float = 0.95, resamples: int = 2000
) -> tuple[float, float]:
    """A `level` percentile bootstrap interval of the median of `samples` (rounds resampled with
    replacement, a fixed seed: the same samples give the same interval)."""
    data = np.asarray(samples, float)
    rng = np.random.default_rng(0)
    medians = np.median(data[rng.integers(0, len(data), (resamples, len(data)))], axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def _row(
    model: str,
    key: str,
    peaks: dict[str, int],
    times: dict[str, list[float]],
    alone: dict[str, dict[str, list[float]]],
    versus: dict[str, dict[str, list[float]]],
    schedules: dict[str, solver.Schedule],
    budgets: dict[str, int],
    problem: solver.Problem,
) -> Row:
    row: Row = {
        "model": model,
        "method": key,
        "peak_MiB": peaks[key] / 2**20,
        "step_ms": statistics.median(times[key]) * 1e3,
        "time_vs_eager": _paired(times, key, "eager"),
    }
    schedule = schedules.get(key)
    if schedule is None:
        return row
    budget = budgets.get(key)
    row["budget_MiB"] = None if budget is None else budget / 2**20
    row["over_budget_bytes"] = None if budget is None else max(0, peaks[key] - budget)
    row["predicted_MiB"] = schedule.peak / 2**20
    row["measured_vs_predicted"] = peaks[key] / schedule.peak
    row["status"] = schedule.status
    row["gap"] = schedule.gap
    row["predicted_recompute"] = schedule.cost / problem.total_cost - 1
    row["predicted_overhead"] = problem.overhead(schedule.cost)
    if key in alone:
        ratios = _ratios(alone[key], key, REMAT_FULL)
        row["measured_overhead"] = statistics.median(ratios) - 1
        low, high = median_interval(ratios)
        row["measured_overhead_low"], row["measured_overhead_high"] = low - 1, high - 1
        row["overhead_among_all"] = _paired(times, key, REMAT_FULL) - 1
        row["overhead_rounds"] = len(ratios)
    matched = key.removeprefix("remat @ ")
    if matched in times:
        row["time_vs_matched"] = _paired(times, key, matched)
    if key in versus:
        row["time_vs_matched_alone"] = _paired(versus[key], key, matched)
    return row


def summary(rows: list[Row]) -> list[Row]:
    """One row per model: remat's time at per-block checkpoint's and the knapsack's measured
    peaks over theirs, the worst measured / predicted and budget excess, the predicted vs
    measured overhead at per-block checkpoint's peak, the floor the certified bound puts under
    the time there (`_floor`), and remat's 100% step over eager's (what the executor adds to
    the kernels eager runs)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["method"]: r for r in rows if r["model"] == model and "step_ms" in r}
        remat = [r for k, r in mine.items() if k.startswith("remat")]
        at_block = mine.get(f"remat @ {PER_BLOCK}", {})
        knapsack = [r for k, r in mine.items() if k.startswith("remat @ knapsack")]
        out.append(
            {
                "model": model,
                "eager_MiB": mine["eager"]["peak_MiB"],
                "per_block_MiB": mine.get(PER_BLOCK, {}).get("peak_MiB"),
                "remat_MiB_at_per_block": at_block.get("peak_MiB"),
                "time_vs_per_block": at_block.get("time_vs_matched"),
                "time_vs_per_block_alone": at_block.get("time_vs_matched_alone"),
                "time_vs_knapsack": min((r["time_vs_matched"] for r in knapsack), default=None),
                "max_measured_vs_predicted": max(r["measured_vs_predicted"] for r in remat),
                "max_over_budget_bytes": max((r["over_budget_bytes"] or 0) for r in remat),
                "gap_at_per_block": at_block.get("gap"),
                "floor_vs_per_block": _floor(at_block),
                "predicted_recompute": at_block.get("predicted_recompute"),
                "predicted_overhead": at_block.get("predicted_overhead"),
                "measured_overhead": at_block.get("measured_overhead"),
                "measured_overhead_low": at_block.get("measured_overhead_low"),
                "measured_overhead_high": at_block.get("measured_overhead_high"),
                "overhead_rounds": at_block.get("overhead_rounds"),
                "overhead_noise": mine[CONTROL]["measured_overhead"],
                "full_vs_eager": mine[REMAT_FULL]["time_vs_eager"],
            }
        )
    return out


def _floor(at_block: Row) -> float | None:
    """The time over per-block checkpoint's (timed alone) that a schedule at the solve's
    certified bound would reach, estimated by taking the step's time as proportional to its
    cost (the measured overhead runs 4-14% above the predicted on the 12-layer transformers):
    about what no schedule in the solver's space can beat, whatever the solve's time limit."""
    ratio, gap = at_block.get("time_vs_matched_alone"), at_block.get("gap")
    if ratio is None or gap is None:
        return None
    return float(ratio) * (1 - float(gap))  # type: ignore[arg-type]


FAMILIES = {
    "eager": "tab:green",
    PER_BLOCK: "tab:red",
    SQRT: "tab:purple",
    "knapsack": "tab:orange",
    "remat": "tab:blue",
}
"""Plot colour of each method family (remat's points joined by a line)."""


def _family(method: str) -> str:
    return next((f for f in FAMILIES if method.startswith(f)), method)


def plot(rows: list[Row], path: Path) -> None:
    """Step time against measured peak, one panel per model, one colour per method family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    columns = min(4, len(models))
    lines = math.ceil(len(models) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.4 * lines), squeeze=False)
    for ax, model in zip(axes.flat, models, strict=False):
        mine = [r for r in rows if r["model"] == model and "step_ms" in r]
        for family, colour in FAMILIES.items():
            points = sorted(
                (r for r in mine if _family(str(r["method"])) == family),
                key=lambda r: r["peak_MiB"],
            )
            if points:
                style = "-o" if family == "remat" else "o"
                xs, ys = [r["peak_MiB"] for r in points], [r["step_ms"] for r in points]
                ax.plot(xs, ys, style, color=colour, label=family)
        ax.set_title(model)
        ax.set_xlabel("measured peak (MiB)")
        ax.set_ylabel("step time, median (ms)")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=sorted(ZOO))
    parser.add_argument("--rounds", type=int, default=30, help="timing rounds (default 30)")
    parser.add_argument(
        "--max-overhead-rounds",
        type=int,
        default=120,
        help="most rounds for a measured overhead, taken --rounds at a time until its 95%% "
        "interval is at most a tenth of it (or one point) wide (default 120)",
    )
    parser.add_argument(
        "--time-limit", type=float, default=30.0, help="seconds per exact solve (default 30)"
    )
    parser.add_argument(
        "--knapsack", type=float, nargs="*", default=[0.5], help="activation_memory_budget(s)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/real_models"))
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for name in args.models:
        rows += run_model(name, args)
        write_table(rows, args.out, "real_models", "Real models at equal measured memory")
        write_table(summary(rows), args.out, "summary", "One row per model")
        plot(rows, args.out / "real_models.png")


if __name__ == "__main__":
    main()
