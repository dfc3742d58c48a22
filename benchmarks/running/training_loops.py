"""Where users train: DDP, autocast and HF models called with ``labels=`` (docs/training.md).

    python -m benchmarks.running.training_loops [--part ddp|autocast|hf|all] [--time-limit 10]

- ``ddp``: two gloo ranks (spawned, CPU) train the demo GPT under DDP; on rank 0, the measured
  peak of one step (profiler allocation events, `.grad` preallocated) of the model alone, of
  DDP around it, of the rematerialized model alone and of DDP around that; whether the
  all-reduced gradients of DDP(remat) equal DDP(model)'s on every step.
- ``autocast``: the demo GPT captured and run under ``torch.autocast("cpu", bfloat16)`` at 50%:
  bit-exactness over 3 AdamW steps.
- ``hf``: each HF family of `graph_capture.models.hf_models` (called with ``labels=``): joint fx
  nodes, DAG nodes (forward / all), capture seconds, the 50% schedule's recomputes, bit-exactness
  over 3 AdamW steps.

One thread per process; the schedule of every part is solved at 50% of the measured plain step
(an HF family whose least peak is above that at "min"; one whose solve fails gets a row naming
the error).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import tempfile
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import solver
from executor.memory import measure_peak
from executor.traced.module import Rematerialized
from graph_capture import capture
from graph_capture.models import hf_models
from graph_capture.models.demo_models import gpt

HF_FAMILIES = ("gpt2_lm", "llama_lm", "bert_mlm", "vit_classifier", "t5_lm")


def _recomputes(rm: Rematerialized) -> int:
    computes = sum(kind == "compute" for kind, _ in rm.schedule.ops)
    return computes - rm.captured.dag.number_of_nodes()


def _exact_steps(
    model: nn.Module,
    rm: Rematerialized,
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    loss_of: Callable[[object], torch.Tensor],
    steps: int = 3,
    autocast: torch.dtype | None = None,
) -> bool:
    """`steps` AdamW steps of `model` (eager) and `rm` (whose model is a copy of it): losses
    and updated parameters `torch.equal` on every step."""
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, rm)]
    exact = True
    for step in range(steps):
        losses = []
        for module, optimizer in zip((model, rm), optimizers, strict=True):
            torch.manual_seed(step)
            with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                loss = loss_of(module(*args, **kwargs))
            loss.backward()
            losses.append(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        exact &= torch.equal(*losses)
        exact &= all(
            torch.equal(a, b)
            for a, b in zip(model.parameters(), rm.model.parameters(), strict=True)
        )
    return exact


def _peak(call: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]) -> int:
    """Measured peak bytes of one forward+backward, `.grad` preallocated, RNG restored."""
    for p in params:
        p.grad = torch.zeros_like(p) if p.grad is None else p.grad
    with torch.random.fork_rng(devices=[]):
        call().backward()  # warm-up: lazy allocations (DDP buckets) happen before the window
        return measure_peak(lambda: call().backward()).peak_bytes


def _ddp_measure(rank: int, schedule_file: str, time_limit: float) -> None:
    """Peaks and exactness of DDP(eager) and DDP(remat) on this rank, printed."""
    model, (idx, targets) = gpt()
    data = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, 96, idx.shape, generator=data)  # different data per rank
    if rank == 0:  # one schedule for every rank: solved once, loaded by all
        captured = capture(copy.deepcopy(model), (idx, targets))
        solver.solve(captured.dag, "50%", time_limit=time_limit).save(schedule_file)
    dist.barrier()
    rm = Rematerialized.load(schedule_file, copy.deepcopy(model), (idx, targets))
    plain_single = copy.deepcopy(model)
    remat_single = Rematerialized(copy.deepcopy(model), rm.captured, rm.schedule)
    ddp_plain, ddp_remat = DistributedDataParallel(model), DistributedDataParallel(rm)
    peaks = {
        "eager, one process": _peak(
            lambda: plain_single(idx, targets), list(plain_single.parameters())
        ),
        "DDP(eager)": _peak(lambda: ddp_plain(idx, targets), list(model.parameters())),
        "remat 50%, one process": _peak(
            lambda: remat_single(idx, targets), list(remat_single.parameters())
        ),
        "DDP(remat 50%)": _peak(lambda: ddp_remat(idx, targets), list(rm.parameters())),
    }
    exact = True
    for step in range(3):
        grads = []
        for ddp in (ddp_plain, ddp_remat):
            torch.manual_seed(100 * step + rank)
            ddp.zero_grad(set_to_none=True)
            ddp(idx, targets).backward()
            grads.append([p.grad for p in ddp.parameters()])
        exact &= all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    if rank == 0:
        params = sum(p.nbytes for p in model.parameters())
        print(
            f"DDP, 2 gloo ranks, demo GPT ({params} parameter bytes), schedule: "
            f"{_recomputes(rm)} recomputes"
        )
        for name, peak in peaks.items():
            print(f"  {name:<24} measured peak {peak / 2**20:7.3f} MiB ({peak} bytes)")
    print(f"  rank {rank}: DDP(remat) grads == DDP(eager) grads on 3 steps: {exact}")


def _ddp_rank(rank: int, init_file: str, schedule_file: str, time_limit: float) -> None:
    """One rank; the DDP wrappers are freed before the process group (docs/training.md)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        _ddp_measure(rank, schedule_file, time_limit)
        gc.collect()
    finally:
        dist.destroy_process_group()


def run_ddp(time_limit: float) -> None:
    with tempfile.TemporaryDirectory() as folder:
        init, schedule = os.path.join(folder, "init"), os.path.join(folder, "schedule.json")
        mp.spawn(_ddp_rank, args=(init, schedule, time_limit), nprocs=2, join=True)


def run_autocast(time_limit: float) -> None:
    torch.set_num_threads(1)
    model, inputs = gpt()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        captured = capture(copy.deepcopy(model), inputs)
    schedule = solver.solve(captured.dag, "50%", time_limit=time_limit)
    rm = Rematerialized(copy.deepcopy(model), captured, schedule)
    exact = _exact_steps(model, rm, inputs, {}, lambda loss: loss, autocast=torch.bfloat16)
    print(
        f"autocast bf16 (CPU), demo GPT at 50%: {_recomputes(rm)} recomputes, "
        f"bit-identical over 3 AdamW steps: {exact}"
    )


def run_hf(time_limit: float) -> None:
    torch.set_num_threads(1)
    print("| family | fx nodes | DAG nodes (forward) | capture s | budget | recomputes | exact |")
    print("|---|---:|---:|---:|---|---:|---|")
    for family in HF_FAMILIES:
        torch.manual_seed(0)
        model, args, kwargs = getattr(hf_models, family)()
        started = time.perf_counter()
        captured = capture(copy.deepcopy(model), args, example_kwargs=kwargs)
        seconds = time.perf_counter() - started
        dag = captured.dag
        nodes = (
            f"| {type(model).__name__} | {len(captured.joint.graph.nodes)} | "
            f"{dag.number_of_nodes()} ({captured.first_backward_index}) | {seconds:.1f} | "
        )
        budget = "50%"
        try:
            try:
                schedule = solver.solve(dag, budget, time_limit=time_limit)
            except solver.InfeasibleBudgetError:  # below the least peak: run the least instead
                budget = "min"
                schedule = solver.solve(dag, budget, time_limit=time_limit)
        except solver.RematError as error:  # a row that says why, the other families go on
            print(nodes + f"{budget} | - | {type(error).__name__}: {str(error).splitlines()[0]} |")
            continue
        rm = Rematerialized(copy.deepcopy(model), captured, schedule)
        exact = _exact_steps(model, rm, args, kwargs, lambda out: out.loss)
        print(nodes + f"{budget} | {_recomputes(rm)} | {exact} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("ddp", "autocast", "hf", "all"), default="all")
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    args = parser.parse_args(argv)
    parts = {"ddp": run_ddp, "autocast": run_autocast, "hf": run_hf}
    for name, run in parts.items():
        if args.part in (name, "all"):
            run(args.time_limit)


if __name__ == "__main__":
    main()
