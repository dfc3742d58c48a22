"""The executor on the demo GPT: peaks, exactness and step times (docs/executor.md, "Demo GPT").

    .venv/bin/python -m benchmarks.running.executor_gpt [--time-limit 60] [--reps 40]

For budgets 100%, 70%, 50% and the minimum: predicted vs measured peak (bytes above the start of
a forward+backward, `.grad` preallocated) against the byte budget, bit-exactness over 3 AdamW
steps, and step time vs eager; then torch.utils.checkpoint with sqrt(n) segments and the exact
schedule solved for checkpoint's measured memory; then the executor's own overhead (the
no-recompute schedule vs eager autograd and vs the captured graph run plainly). Times are
medians over `--reps` interleaved repetitions (eager, candidate, eager, ...) on one thread.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

import solver
from cli.run import sqrt_checkpointed
from executor.memory import measure_peak
from executor.traced.module import Rematerialized
from graph_capture import capture
from graph_capture.models.demo_models import gpt


def _timed(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per call over `reps` interleaved rounds (each call once per round).
    On a shared machine contention only adds time: the minimum is the cleanest estimate."""
    return {name: (statistics.median(s), min(s)) for name, s in _interleaved(calls, reps).items()}


def _fmt(times: dict[str, tuple[float, float]], name: str) -> str:
    """'median ms (min ms) | +x% (+y%)' relative to eager."""
    (med, low), (e_med, e_low) = times[name], times["eager"]
    return (
        f"{1e3 * med:.2f} ({1e3 * low:.2f}) ms | "
        f"{100 * (med / e_med - 1):+.1f}% ({100 * (low / e_low - 1):+.1f}%)"
    )


def _interleaved(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm-up
        call()
    for _ in range(reps):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - t0)
    return seconds


def _step(call: Callable[..., torch.Tensor], inputs) -> Callable[[], None]:
    return lambda: call(*inputs).backward()


def _with_grads(model: torch.nn.Module) -> torch.nn.Module:
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return model


def _exact_over_steps(model, captured, schedule, inputs, steps: int = 3) -> bool:
    eager, remat_model = copy.deepcopy(model), copy.deepcopy(model)
    rm = Rematerialized(remat_model, captured, schedule)
    runs = []
    for module, params in ((eager, eager.parameters()), (rm, remat_model.parameters())):
        opt = torch.optim.AdamW(params, lr=1e-3)
        torch.manual_seed(0)
        record = []
        for _ in range(steps):
            opt.zero_grad()
            loss = module(*inputs)
            loss.backward()
            record.append([loss.detach()] + [p.grad.clone() for p in opt.param_groups[0]["params"]])
            opt.step()
        record.append(torch.get_rng_state())
        runs.append(record)
    same_steps = all(
        torch.equal(a, b)
        for ra, rb in zip(runs[0][:-1], runs[1][:-1], strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    same_params = all(
        torch.equal(a, b)
        for a, b in zip(eager.state_dict().values(), remat_model.state_dict().values(), strict=True)
    )
    return same_steps and same_params and torch.equal(runs[0][-1], runs[1][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = gpt()
    captured = capture(model, inputs, plain_peak=True)
    problem = solver.prepare(captured.dag)
    full = solver.checkpoint_all_peak(problem)
    mib = 2**20

    eager = _with_grads(copy.deepcopy(model))
    eager_peak = measure_peak(_step(eager, inputs)).peak_bytes
    ckpt = _with_grads(sqrt_checkpointed(copy.deepcopy(model)))
    ckpt_peak = measure_peak(_step(ckpt, inputs)).peak_bytes
    print(
        f"demo gpt: {captured.dag.number_of_nodes()} DAG nodes, checkpoint-all peak "
        f"{full / mib:.3f} MiB, eager measured {eager_peak / mib:.3f} MiB, 100% (the plain "
        f"step, .grad created in it) {captured.dag.graph['plain_peak'] / mib:.3f} MiB"
    )

    rows = []
    budgets: list[tuple[str, str]] = [
        ("100%", "100%"),
        ("70%", "70%"),
        ("50%", "50%"),
        ("min", "min"),
    ]
    rm_full = None
    for label, budget in budgets:
        t0 = time.perf_counter()
        schedule = solver.solve(captured.dag, budget=budget, time_limit=args.time_limit)
        solve_s = time.perf_counter() - t0
        rm = Rematerialized(_with_grads(copy.deepcopy(model)), captured, schedule)
        if label == "100%":
            rm_full = rm
        step = _step(rm, inputs)
        step()
        measured = measure_peak(step).peak_bytes
        times = _timed({"eager": _step(eager, inputs), "remat": step}, args.reps)
        rows.append(
            (
                label,
                schedule,
                solve_s,
                measured,
                _exact_over_steps(model, captured, schedule, inputs),
                times,
            )
        )

    print(
        "\n| budget | schedule | recomputes | budget bytes | predicted peak | measured peak | "
        "measured / predicted | measured <= budget | exact (3 AdamW steps) | predicted "
        "recompute | step time median (min) | vs eager median (min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, s, solve_s, measured, exact, times in rows:
        limit = s.peak if s.budget is None else s.budget
        print(
            f"| {label} | {s.method} {s.status} ({solve_s:.0f} s) | {s.recomputes} | "
            f"{'-' if s.budget is None else s.budget} | {s.peak / mib:.3f} MiB | "
            f"{measured / mib:.3f} MiB | {measured / s.peak:.3f} | "
            f"{'yes' if measured <= limit else 'NO'} | {'yes' if exact else 'NO'} | "
            f"{100 * (s.cost / problem.total_cost - 1):+.1f}% | {_fmt(times, 'remat')} |"
        )

    # torch.utils.checkpoint sqrt(n) vs the exact schedule at checkpoint's measured memory
    match_budget = ckpt_peak
    matched = solver.solve(captured.dag, budget=match_budget, time_limit=args.time_limit)
    rm_matched = Rematerialized(_with_grads(copy.deepcopy(model)), captured, matched)
    step_matched = _step(rm_matched, inputs)
    step_matched()
    matched_peak = measure_peak(step_matched).peak_bytes
    times = _timed(
        {"eager": _step(eager, inputs), "ckpt": _step(ckpt, inputs), "matched": step_matched},
        args.reps,
    )
    segments = next(
        m.checkpoint_segments for m in ckpt.modules() if hasattr(m, "checkpoint_segments")
    )
    print("\n| run | recomputes | measured peak | step time median (min) | vs eager median (min) |")
    print("|---|---|---|---|---|")
    print(f"| eager | 0 | {eager_peak / mib:.3f} MiB | {_fmt(times, 'eager')} |")
    print(
        f"| checkpoint_sequential, sqrt(n)={segments} segments | - | {ckpt_peak / mib:.3f} MiB | "
        f"{_fmt(times, 'ckpt')} |"
    )
    print(
        f"| exact schedule at budget {match_budget / mib:.3f} MiB | {matched.recomputes} | "
        f"{matched_peak / mib:.3f} MiB | {_fmt(times, 'matched')} |"
    )

    # the executor's own overhead: no-recompute schedule vs eager vs the graph run plainly
    assert rm_full is not None
    interpreted = Rematerialized(
        _with_grads(copy.deepcopy(model)), captured, rm_full.schedule, compiled=False
    )
    tangents = captured.default_tangents()
    plain_model = copy.deepcopy(model)
    samples = _interleaved(
        {
            "eager": _step(eager, inputs),
            "compiled": _step(rm_full, inputs),
            "interpreted": _step(interpreted, inputs),
            "plain graph": lambda: captured.run_plain(plain_model, inputs, tangents),
        },
        5 * args.reps,
    )
    med = {name: statistics.median(s) for name, s in samples.items()}
    low = {name: min(s) for name, s in samples.items()}
    print(
        f"\n| no-recompute schedule (100%), {5 * args.reps} interleaved rounds | median | "
        "vs eager | min | vs eager |"
    )
    print("|---|---|---|---|---|")
    for name in samples:
        print(
            f"| {name} | {1e3 * med[name]:.2f} ms | {100 * (med[name] / med['eager'] - 1):+.1f}% "
            f"| {1e3 * low[name]:.2f} ms | {100 * (low[name] / low['eager'] - 1):+.1f}% |"
        )


if __name__ == "__main__":
    main()
