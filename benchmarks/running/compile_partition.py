"""remat's partition under torch.compile (inductor, CPU, one thread) against compile's own
knapsack (`activation_memory_budget`) and a SAC plan compiled: measured peaks and step times.

    python -m benchmarks.running.compile_partition [--models gpt2_4 resnet18] [--ratios 0 0.5 1]

Per model: the plain compiled step (torch's partition, budget 1.0); the knapsack sweep (with
``--layouts`` also with inductor's layout optimization off); remat's least budget that fits
("min") and three budgets between it and the plain peak, each with its measured peak, step
time, the fastest knapsack setting that fits and the time ratio; gradients against the plain
compiled model under remat's inductor options (allclose, rtol 1e-5) and, under aot_eager at
the middle budget ("min" where that is below its least), against eager (torch.equal); the SAC
plan at the middle budget ("min" where that is below SAC's least), compiled. Peaks print as
they are measured (partial output survives a timeout); step times are medians over
``--rounds`` rounds run at the end, each round timing every compiled step once, so that load
from other processes falls on all of them alike.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import executor
from benchmarks.zoo import ZOO
from executor.compiled.partitioner import LAYOUT
from executor.compiled.step import fresh_call
from graph_capture.measurement.peak import Snapshot, measure_peak


def _step(call, inputs):
    call(*inputs).backward()


def measure(model, call, inputs) -> int:
    """Peak bytes of the compiled step, after its compile step."""
    snapshot = Snapshot(model)
    model.zero_grad(set_to_none=True)
    _step(call, inputs)
    model.zero_grad(set_to_none=True)
    peak = measure_peak(lambda: _step(call, inputs)).peak_bytes
    snapshot.restore()
    return peak


def interleaved(steps: dict, inputs, rounds: int) -> dict:
    """Median seconds per step of each ``steps`` entry (label -> (model, call)), over
    ``rounds`` rounds that each time every step once."""
    times: dict = {label: [] for label in steps}
    for _ in range(rounds):
        for label, (model, call) in steps.items():
            snapshot = Snapshot(model)
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            _step(call, inputs)
            times[label].append(time.perf_counter() - t0)
            snapshot.restore()
    return {label: statistics.median(t) for label, t in times.items()}


def grads(model, call, inputs, seed: int = 0) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    _step(call, inputs)
    out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out


def knapsack(model, inputs, ratio: float, layout: bool = True):
    """(peak bytes, the compiled call) of torch's partition at ``activation_memory_budget``;
    ``layout``: inductor's layout optimization as torch's default (on), else off, as
    remat's partition compiles (`executor.compiled.partitioner.LAYOUT`)."""
    call = torch.compile(fresh_call(model), fullgraph=True, dynamic=False)
    with (
        torch._functorch.config.patch(activation_memory_budget=ratio),
        torch._inductor.config.patch(layout_optimization=layout),
    ):
        return measure(model, call, inputs), call


def _at(budget: int | str) -> str:
    return f"{budget / 2**20:.2f} MiB" if budget != "min" else "'min'"


def run(name: str, ratios: list[float], time_limit: float, rounds: int, layouts: bool) -> None:
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    mib = 2**20
    steps, budget_of = {}, {}
    sweeps: dict[str, dict[float, int]] = {}  # "" (torch's default), ", layout off"
    for layout in (True, False) if layouts else (True,):
        suffix = "" if layout else ", layout off"
        sweep = sweeps[suffix] = {}
        for ratio in ratios:
            sweep[ratio], call = knapsack(model, inputs, ratio, layout=layout)
            steps[f"knapsack {ratio:.1f}{suffix}"] = (model, call)
            print(f"{name} knapsack {ratio:.1f}{suffix}: {sweep[ratio] / mib:.2f} MiB", flush=True)
    sweep = sweeps[""]
    plain_peak = sweep[1.0] if 1.0 in sweep else knapsack(model, inputs, 1.0)[0]
    # the reference: torch's partition compiled with the options remat's partition adds
    plain = torch.compile(fresh_call(model), fullgraph=True, dynamic=False, options=LAYOUT)
    plain_grads = grads(model, plain, inputs)
    try:
        least = executor.compile(model, inputs, "min", time_limit=time_limit)
    except executor.CompileError as e:
        print(f"{name} remat min: refused: {e}", flush=True)
        return
    low = least.remat.peak
    steps["remat min"], budget_of["remat min"] = (model, least), low
    print(
        f"{name} remat min: {low / mib:.2f} MiB (compiles {least.remat.compiles}, predicted "
        f"{least.remat.tries[-1].predicted / mib:.2f}); knapsack least "
        f"{min(sweep.values()) / mib:.2f} MiB",
        flush=True,
    )
    budgets = [int(low + f * (plain_peak - low)) for f in (0.1, 0.5, 0.9)]
    for budget in budgets:
        try:
            cm = executor.compile(model, inputs, budget, time_limit=time_limit)
        except executor.CompileError as e:
            print(f"{name} remat {budget / mib:.2f} MiB: refused: {e}", flush=True)
            continue
        peak = measure(model, cm, inputs)
        steps[f"remat {budget / mib:.2f} MiB"] = (model, cm)
        budget_of[f"remat {budget / mib:.2f} MiB"] = budget
        close = all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-6)
            for a, b in zip(grads(model, cm, inputs), plain_grads, strict=True)
        )
        print(
            f"{name} remat {budget / mib:.2f} MiB: peak {peak / mib:.2f} MiB "
            f"(within: {peak <= budget}), compiles {cm.remat.compiles}, predicted "
            f"{[round(t.predicted / mib, 2) for t in cm.remat.tries]} MiB, grads allclose to "
            f"plain compiled: {close}",
            flush=True,
        )
    middle = budgets[1]
    eager = copy.deepcopy(model)
    # aot_eager's least (unfused: every value held) can lie above the middle budget: "min"
    for aot_budget in (middle, "min"):
        at = _at(aot_budget)
        try:
            cm = executor.compile(
                model, inputs, aot_budget, backend="aot_eager", time_limit=time_limit
            )
        except executor.CompileError as e:
            print(f"{name} aot_eager at {at}: refused: {e}", flush=True)
            continue
        same = all(
            torch.equal(a, b)
            for a, b in zip(grads(model, cm, inputs), grads(eager, eager, inputs), strict=True)
        )
        print(f"{name} aot_eager at {at}: grads equal to eager: {same}", flush=True)
        break
    for sac_budget in (middle, "min"):  # SAC's least where the middle budget is below it
        at = _at(sac_budget)
        try:
            plan = executor.checkpoint_plan(eager, inputs, sac_budget, time_limit=30)
            applied = plan.apply(eager)
            call = torch.compile(fresh_call(applied), dynamic=False)
            peak = measure(applied, call, inputs)
            steps["SAC plan"] = (applied, call)
            print(f"{name} SAC plan at {at} compiled: peak {peak / mib:.2f} MiB", flush=True)
            break
        except Exception as e:
            print(f"{name} SAC plan at {at}: {type(e).__name__}: {e}", flush=True)
    seconds = interleaved(steps, inputs, rounds)
    for label, t in seconds.items():
        print(f"{name} {label}: {t * 1e3:.1f} ms (median of {rounds} interleaved rounds)")
    for label, budget in budget_of.items():
        for suffix, swept in sweeps.items():
            fits = [
                (seconds[f"knapsack {r:.1f}{suffix}"], f"{r:.1f}{suffix}")
                for r, p in swept.items()
                if p <= budget
            ]
            if fits:
                best = min(fits)
                print(
                    f"{name} {label} vs fastest fitting knapsack {best[1]} "
                    f"({best[0] * 1e3:.1f} ms): {seconds[label] / best[0]:.2f}x",
                    flush=True,
                )
            else:
                print(f"{name} {label}: no knapsack{suffix} setting fits", flush=True)


def ignore_hf_logging() -> None:
    """Let dynamo trace through transformers' `Logger.warning_once` (HF's loss warns once about
    its config's ``loss_type``), which would otherwise break the graph that remat compiles
    whole."""
    import logging

    import transformers  # noqa: F401 (attaches Logger.warning_once, which dynamo skips)

    torch._dynamo.config.ignore_logging_functions.add(logging.Logger.warning_once)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["gpt2_4", "resnet18", "llama_4", "bert_4", "vit_4", "mobilenet_v3_small"],
    )
    parser.add_argument(
        "--ratios", nargs="+", type=float, default=[round(0.1 * i, 1) for i in range(11)]
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=240.0,
        help="seconds per executor.compile call, its compiles and measurements included",
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument(
        "--layouts",
        action="store_true",
        help="also sweep (and time) the knapsack with inductor's layout optimization off",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    ignore_hf_logging()
    for name in args.models:
        run(name, args.ratios, args.time_limit, args.rounds, args.layouts)


if __name__ == "__main__":
    main()
