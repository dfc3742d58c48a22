"""The own executor running offload schedules on the CPU (docs/offload.md, "Running offload").

    python -m benchmarks.running.offload [--width 16] [--factor 8] [--batch 32]
                                         [--time-limit 30] [--reps 30]

`Reduction` (a small row maximum of a wide activation, read at the end), one thread: the least
peak keep/recompute reaches ("min"), then the exact offload schedules over a link of
``--gbps`` GB/s each way at that least and 8 bytes below it (where only offload fits). For
each schedule: predicted peak and measured device peak (profiler allocation events, bytes
above the start of a forward+backward, `.grad` allocated before it; the host pool's numpy
buffers are outside torch's allocator, so not in it), predicted and measured host peak
(`HostPool.host_peak`), copies, predicted cost (compute plus stall, over the link) and the
measured median step time against eager over ``--reps`` interleaved rounds. On the CPU a copy
is a memcpy, not a PCIe transfer: the step times say what this executor costs here, not what a
GPU would take; the predicted cost is the model's, over the link given.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import solver
from executor.memory import measure_peak
from executor.traced.module import Rematerialized
from graph_capture import capture
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.device import fork_rng


class Reduction(nn.Module):
    """A small value (the row maximum of a wide one) read at the end: keeping it through the
    wide part, or recomputing it from the wide value, costs bytes that offloading it does not."""

    def __init__(self, width: int = 16, factor: int = 8) -> None:
        super().__init__()
        self.up = nn.Linear(width, factor * width)
        self.down = nn.Linear(factor * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = self.up(x)
        small = wide.amax(-1, keepdim=True)
        return torch.tanh(self.down(torch.sigmoid(wide))) * small


def _step(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        out = call(x)
        out.backward(torch.ones_like(out))

    return run


def interleaved_median_seconds(calls: dict[str, Callable[[], None]], reps: int) -> dict[str, float]:
    """Median seconds per call over `reps` interleaved rounds, after one warm-up round."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(reps):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def solved(
    model: nn.Module,
    x: torch.Tensor,
    gbps: float = 1.0,
    time_limit: float = 30.0,
    below: tuple[int, ...] = (0, 8),
) -> tuple[CapturedGraph, dict[str, solver.Schedule]]:
    """The capture of `model` on `x` and its schedules by label: the least peak keep/recompute
    reaches, and the exact offload schedules (two CP-SAT workers, `time_limit` seconds each) over
    a link of `gbps` GB/s each way at budgets `below` bytes under that least."""
    captured = capture(model, [x])
    least = solver.solve(captured.dag, "min", time_limit=time_limit)
    link = solver.Link(gbps * 1e9, gbps * 1e9)
    schedules = {"keep/recompute at its least": least}
    for under in below:
        schedules[f"offload {under} B below it"] = solver.solve(
            captured.dag, least.peak - under, offload=link, time_limit=time_limit, workers=2
        )
    return captured, schedules


def measure(
    model: nn.Module,
    x: torch.Tensor,
    captured: CapturedGraph,
    schedules: dict[str, solver.Schedule],
    reps: int = 30,
) -> list[dict[str, object]]:
    """One row per schedule (keys as printed; bytes, seconds); see the module docstring."""
    eager = copy.deepcopy(model)
    calls = {"eager": _step(eager, x)}
    rows = []
    for label, schedule in schedules.items():
        rm = Rematerialized(copy.deepcopy(model), captured, schedule)
        for p in rm.parameters():
            p.grad = torch.zeros_like(p)
        with fork_rng(torch.device("cpu")):
            _step(rm, x)()
            if rm.host_pool is not None:
                rm.host_pool.reset_peak()
            measured = measure_peak(_step(rm, x)).peak_bytes
        kinds = [kind for kind, _ in schedule.ops]
        rows.append(
            {
                "schedule": label,
                "status": schedule.status,
                "budget_bytes": schedule.budget,
                "predicted_peak": schedule.peak,
                "measured_device_peak": measured,
                "predicted_host_peak": schedule.extra.get("host_peak", 0),
                "measured_host_peak": 0 if rm.host_pool is None else rm.host_pool.host_peak,
                "offloads": kinds.count("offload"),
                "reloads": kinds.count("reload"),
                "recomputes": schedule.recomputes,
                "predicted_cost_s": schedule.cost,
            }
        )
        calls[label] = _step(rm, x)
    times = interleaved_median_seconds(calls, reps)
    for row in rows:
        row["step_vs_eager_measured"] = times[row["schedule"]] / times["eager"]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--factor", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--gbps", type=float, default=1.0, help="link GB/s each way")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = Reduction(args.width, args.factor).train(), torch.randn(args.batch, args.width)
    captured, schedules = solved(model, x, args.gbps, args.time_limit)
    rows = measure(model, x, captured, schedules, args.reps)
    for row in rows:
        print(
            ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
            )
        )


if __name__ == "__main__":
    main()
