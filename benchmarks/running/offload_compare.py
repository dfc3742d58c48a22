"""remat's offload against whole-activation offload (docs/offload.md, "Against torch's pass,
torchtune's hooks and HF's save_on_cpu").

    python -m benchmarks.running.offload_compare [--models gpt stack] [--budget 0.5]
                                                 [--time-limit 20] [--reps 15]

Per model, one row per method, each a real training step here (one thread), its parameters'
gradients compared to eager's with `torch.equal`:

- ``eager``: nothing offloaded.
- ``save_on_cpu``, ``HF offload``, ``torchtune``: the whole-activation offload baselines as
  saved-tensor hooks (`benchmarks.running.offload_compare_baselines` states what each does).
- ``remat keep/recompute``, ``remat offload``: the own executor (`executor.Rematerialized`)
  under `solver.solve` at the budget, without and with the H100's host link
  (``offload=host_link("h100")``, PCIe Gen5, 64 GB/s each way).

Every host copy, the baselines' included, lives in `executor.traced.offload.HostPool` (numpy
memory, outside torch's CPU allocator), so `measure_peak`'s profiler events count the device
side alone and the pool the host side, for every row alike.

Columns: ``device peak`` (measured: bytes above the step's start, `.grad` allocated before),
``host peak`` (measured: `HostPool.host_peak`), ``d2h``/``h2d`` (measured bytes copied each way
in the step), ``grads`` (``equal``: every gradient `torch.equal` to eager's, asserted),
``cpu step`` (measured: median seconds over ``--reps`` interleaved rounds, one thread; a copy
here is a memcpy), ``h100 step`` (*predicted*: the captured DAG with each node's seconds from
the H100 roofline of estimate mode, `graph_capture.capture(..., target="h100")`, and copies over
its PCIe Gen5 link, 64 GB/s each way and 5 microseconds a copy: eager is the keep-all schedule's
compute; ``save_on_cpu`` and HF add every measured copy's link time (its latency and its bytes
over the bandwidth) in full (serial with compute; HF also reruns its blocks' forward nodes
once); torchtune is the keep-all schedule with an offload op after each
saved value of >= 1 KiB, its free five offloads later (or after its last forward read) and a
reload right before its first backward read, simulated by `solver.simulate` (copies overlap
compute on one engine per direction, the clock waits where a value is read before its reload
has arrived); remat's rows are their schedules' cost, solved on those H100 seconds and
simulated the same way). The budget is ``--budget`` times eager's measured device peak.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence

import torch
from torch import nn

import solver
from benchmarks.models import MODELS
from benchmarks.running.offload import interleaved_median_seconds
from benchmarks.running.offload_compare_baselines import (
    SaveOnCpu,
    Step,
    TorchtuneOffload,
    hf_step,
    hooked_step,
    loss_step,
    step_gradients,
)
from benchmarks.running.offload_compare_predict import h100_costs, torchtune_ops
from benchmarks.running.offload_compare_report import Row, table
from executor.memory import measure_peak
from executor.traced.module import Rematerialized
from executor.traced.offload import HostPool
from graph_capture import capture
from graph_capture.captured import CapturedGraph
from solver import Link
from solver.errors import InfeasibleBudgetError, SolverTimeoutError
from solver.target.devices import host_link


def compare(
    name: str,
    budget_fraction: float = 0.5,
    time_limit: float = 20.0,
    reps: int = 15,
    granularity: str = "module",
) -> list[Row]:
    """The rows of the module docstring for benchmark model `name` (`benchmarks.models.MODELS`):
    the baselines, then remat's two rows at `budget_fraction` of eager's device peak and at
    torchtune's measured device peak (solves of `time_limit` seconds on the DAG of
    `granularity`)."""
    bench = MODELS[name]()
    model, inputs = bench.model, tuple(bench.inputs)
    link = host_link("h100")
    seed = 0

    eager = copy.deepcopy(model)
    eager_step = loss_step(eager, inputs)
    reference = step_gradients(eager, eager_step, seed)
    eager_peak = measure_peak(eager_step).peak_bytes

    captured = capture(model, inputs, granularity=granularity)
    h100_costs(captured.dag, model, inputs, granularity)
    keep_all = solver.solve(captured.dag, 1 << 62, time_limit=time_limit)
    compute = keep_all.cost

    rows = [Row(name, "eager", None, eager_peak, h100_step=compute)]
    steps: dict[str, Step] = {"eager": eager_step}

    def run_hooked(method: str, step: Step, last: list, pool: HostPool, replica: nn.Module) -> Row:
        grads = step_gradients(replica, step, seed)
        assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True)), method
        pool.reset_peak()
        peak = measure_peak(step).peak_bytes
        hooks = last[0]
        steps[method] = step
        return Row(
            name, method, None, peak, pool.host_peak, hooks.d2h_bytes, hooks.h2d_bytes, "equal"
        )

    pool = HostPool()
    replica = copy.deepcopy(model)
    step, last = hooked_step(replica, inputs, lambda: SaveOnCpu(pool))
    row = run_hooked("save_on_cpu", step, last, pool, replica)
    row.h100_step = compute + _copy_seconds(last[0], link)
    rows.append(row)

    if bench.blocks:
        pool = HostPool()
        replica = copy.deepcopy(model)
        names = {id(m): n for n, m in model.named_modules()}
        prefixes = [names[id(b)] for b in bench.blocks]
        blocks = [replica.get_submodule(p) for p in prefixes]
        step, last = hf_step(replica, inputs, blocks, pool)
        row = run_hooked("HF offload", step, last, pool, replica)
        rerun = sum(
            d["cost"]
            for _, d in captured.dag.nodes(data=True)
            if not d.get("backward")
            and any(d["module"] == p or d["module"].startswith(p + ".") for p in prefixes)
        )
        row.h100_step = compute + rerun + _copy_seconds(last[0], link)
        rows.append(row)

    pool = HostPool()
    replica = copy.deepcopy(model)
    step, last = hooked_step(replica, inputs, lambda: TorchtuneOffload(pool))
    row = run_hooked("torchtune", step, last, pool, replica)
    ops = torchtune_ops(captured.dag, keep_all.ops)
    row.h100_step = solver.simulate(captured.dag, ops, link).cost
    rows.append(row)
    assert row.device_peak is not None

    for budget in (int(budget_fraction * eager_peak), row.device_peak):
        for method, offload in (("remat keep/recompute", None), ("remat offload", link)):
            try:
                row, step, grads = _remat_row(
                    name, method, captured, model, inputs, budget, offload, time_limit
                )
            except (InfeasibleBudgetError, SolverTimeoutError) as error:
                reason = "none fits" if isinstance(error, InfeasibleBudgetError) else "none found"
                rows.append(Row(name, f"{method} @ {budget:,} B", budget, note=reason))
                continue
            assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True)), method
            steps[row.method] = step
            rows.append(row)

    seconds = interleaved_median_seconds(steps, reps)
    for row in rows:
        row.cpu_step = seconds.get(row.method, 0.0)
    return rows


def _copy_seconds(hooks: SaveOnCpu | TorchtuneOffload, link: Link) -> float:
    """Seconds the copies ``hooks`` counted take over ``link``, one after another: per
    direction, each copy's latency plus the bytes over the bandwidth."""
    d2h = hooks.d2h_copies * link.d2h_latency + hooks.d2h_bytes / link.d2h
    return d2h + hooks.h2d_copies * link.h2d_latency + hooks.h2d_bytes / link.h2d


def _remat_row(
    name: str,
    method: str,
    captured: CapturedGraph,
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    budget: int,
    offload: Link | None,
    time_limit: float,
) -> tuple[Row, Step, list[torch.Tensor]]:
    """remat's own executor at `budget`: its row (``method`` and the budget in its label), a
    step of it and its gradients. `solver.solve`'s errors where no schedule fits
    (`InfeasibleBudgetError`) or none is found in `time_limit` (`SolverTimeoutError`)."""
    schedule = solver.solve(captured.dag, budget, offload=offload, time_limit=time_limit, workers=2)
    rm = Rematerialized(copy.deepcopy(model), captured, schedule)
    step = loss_step(rm, inputs)
    grads = step_gradients(rm, step, 0)
    if rm.host_pool is not None:
        rm.host_pool.reset_peak()
    peak = measure_peak(step).peak_bytes
    copied = {"offload": 0, "reload": 0}
    for kind, v in schedule.ops:
        if kind in copied:
            copied[kind] += captured.dag.nodes[v]["mem"]
    row = Row(
        name,
        f"{method} @ {budget:,} B",
        budget,
        peak,
        0 if rm.host_pool is None else rm.host_pool.host_peak,
        copied["offload"],
        copied["reload"],
        "equal",
        h100_step=schedule.cost,
        note=f"{schedule.status}, {schedule.recomputes} recomputes",
    )
    return row, step, grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt", "stack16"], choices=list(MODELS))
    parser.add_argument("--budget", type=float, default=0.5, help="of eager's device peak")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--granularity", choices=["op", "module"], default="module")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        row
        for name in args.models
        for row in compare(name, args.budget, args.time_limit, args.reps, args.granularity)
    ]
    print(table(rows))


if __name__ == "__main__":
    main()
