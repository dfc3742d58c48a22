"""SAC plans in estimate mode against measured mode, and estimate mode at Llama-3-8B scale.

    python -m benchmarks.planning.sac_estimate [--models gpt2_tiny gpt2_4 llama_4 resnet18]
        [--budget 0.6]
    python -m benchmarks.planning.sac_estimate --scale-only   # the Llama-3-8B row alone

Per model (one thread; zoo models from `benchmarks.zoo`, ``gpt2_tiny`` HF GPT-2 with 3 layers of
width 32): `executor.checkpoint_plan` measured (target None) and in estimate mode (target
``cpu``, no real step) at the same budget in bytes, `--budget` times the measured plain step's
peak (or "min"); each plan's planning seconds, predicted plain and plan peaks, then each plan
run on its own copy of the real model: measured peak (profiler allocation events above the
step's start, `.grad` created in the step) and median step time (`cli.sac.measure_step`).
Where the budget is below SAC's least peak (the zoo's CNNs at 60%), a plan's budget is "min".

`--scale-only` or the last row: Llama-3-8B's config (hidden 4096, 32 layers, 32 heads, 8 KV
heads, intermediate 14336, vocabulary 128,256) built on the meta device in bfloat16, batch 1,
sequence 8192, planned for target h100 at 60% in a child process (`--scale-time-limit`,
default 100 s, bounds the call): the recording's and the whole call's seconds, the child's peak
RSS.
Writes sac_estimate.md/.csv under --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

import executor
from benchmarks.common import write_table
from cli.sac import measure_step
from solver.errors import InfeasibleBudgetError

MIB = 1 << 20


def _model(name: str):
    """(model, inputs, kwargs) of a benchmark name."""
    if name == "gpt2_tiny":
        from graph_capture.models.hf_models import gpt2_lm

        model, args, kwargs = gpt2_lm(batch=2, seq=16, layers=3, width=32)
        return model, args, {**kwargs, "use_cache": False}
    from benchmarks.zoo import ZOO

    model, inputs = ZOO[name]()
    return model, inputs, {}


def compare(name: str, budget: str, steps: int, time_limit: float) -> dict:
    """One row: the measured-mode and the estimate-mode plan of `name` at one budget."""
    model, inputs, kwargs = _model(name)
    row: dict = {"model": name}
    plans = {}
    for mode, target in (("measured", None), ("estimate", "cpu")):
        # the same bytes for both: the measured plan's budget
        given = budget if mode == "measured" or budget == "min" else plans["measured"].budget
        start = time.perf_counter()
        try:
            plan = executor.checkpoint_plan(
                model, inputs, given, example_kwargs=kwargs, time_limit=time_limit, target=target
            )
        except InfeasibleBudgetError:  # below SAC's least peak (a CNN at 60%): its least
            given = "min"
            plan = executor.checkpoint_plan(
                model, inputs, given, example_kwargs=kwargs, time_limit=time_limit, target=target
            )
        row[f"{mode} plan s"] = round(time.perf_counter() - start, 2)
        row[f"{mode} budget"] = given if isinstance(given, str) else "measured plan's"
        plans[mode] = plan
    row["budget MiB"] = plans["measured"].budget / MIB
    for mode, plan in plans.items():
        row[f"{mode} plain MiB"] = plan.plain_peak / MIB
    eager_peak, eager_s, _ = measure_step(copy.deepcopy(model), inputs, kwargs, steps)
    row["eager MiB"] = eager_peak / MIB
    row["eager ms"] = eager_s * 1e3
    for mode, plan in plans.items():
        peak, seconds, _ = measure_step(plan.apply(copy.deepcopy(model)), inputs, kwargs, steps)
        row[f"{mode} predicted MiB"] = plan.peak / MIB
        row[f"{mode} measured MiB"] = peak / MIB
        row[f"{mode} ms"] = seconds * 1e3
        row[f"{mode} regions"] = (
            f"{len(plan.checkpointed_regions())} ({sum(map(len, plan.saved))} saved)"
        )
    row["estimate / measured step"] = row["estimate ms"] / row["measured ms"]
    return row


def llama8b(time_limit: float) -> dict:
    """Plan Llama-3-8B (seq 8192, bf16, meta) for h100 in this process: seconds and RSS."""
    import executor.sac.recorded_step as plan_module
    from benchmarks.planning.scale_llama import build

    model, ids, step_kwargs = build("llama3_8b")
    solve, solving = plan_module.solve_sac, []

    def timed_solve(*args, **kwargs):
        solving.append(time.perf_counter())
        return solve(*args, **kwargs)

    plan_module.solve_sac = timed_solve
    start = time.perf_counter()
    plan = executor.checkpoint_plan(
        model,
        (ids,),
        "60%",
        example_kwargs=step_kwargs,
        target="h100",
        time_limit=time_limit,
    )
    end = time.perf_counter()
    return {
        "model": "llama3_8b seq 8192 bf16 (meta, target h100, 60%)",
        "recording s": round(solving[0] - start, 1),
        "plan s": round(end - start, 1),
        "peak RSS GiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20),
        "predicted plain GiB": plan.plain_peak / (1 << 30),
        "predicted plan GiB": plan.peak / (1 << 30),
        "status": f"{plan.status} gap {plan.gap:.2%}",
        "regions": f"{len(plan.checkpointed_regions())} of {len(plan.regions)}",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["gpt2_tiny", "gpt2_4", "llama_4", "resnet18"]
    )
    parser.add_argument(
        "--budget", default="0.6", help="fraction of the measured plain peak, or min"
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=60)
    parser.add_argument("--scale-time-limit", type=float, default=100)
    parser.add_argument("--scale-only", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.child:
        print(json.dumps(llama8b(args.scale_time_limit)))
        return
    rows = []
    budget = "min" if args.budget == "min" else f"{float(args.budget) * 100:g}%"
    for name in [] if args.scale_only else args.models:
        row = compare(name, budget, args.steps, args.time_limit)
        print(json.dumps(row), flush=True)
        rows.append(row)
    command = [sys.executable, "-m", "benchmarks.planning.sac_estimate", "--child"]
    command += ["--scale-time-limit", str(args.scale_time_limit)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    scale = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(scale), flush=True)
    if rows:
        print(write_table(rows, args.out, "sac_estimate", "SAC plans: estimate vs measured mode"))
    print(write_table([scale], args.out, "sac_estimate_scale", "Estimate mode at scale"))


if __name__ == "__main__":
    main()
