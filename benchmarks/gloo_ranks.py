"""Two gloo ranks on the CPU, spawned, for the distributed tests and benchmarks: each runs
`train(rank)` and saves its result for the parent.

The result's wrappers (DDP, FSDP2) are freed (`train` returns, `gc.collect`) before the process
group is destroyed. Otherwise a wrapper's reducer may hold the group's last reference, and the
group's destructor then runs inside the reducer's with the GIL held and joins gloo's worker
threads; a worker freeing an all-reduce launched in a backward needs the GIL (torch 2.13 keeps a
Python object in that work's thread-local state), so the rank deadlocks at exit (seen in about 1
of 15 runs). Destroyed from `destroy_process_group`, the group releases the GIL first.
"""

from __future__ import annotations

import datetime
import gc
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _rank(
    rank: int, init_file: str, results: str, train: Callable[[int], object], timeout: float
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(  # a rank that fails makes the other time out, not hang
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=timeout),
    )
    try:
        result = train(rank)
        gc.collect()
        torch.save(result, os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def on_gloo_ranks(train: Callable[[int], object], folder: Path, timeout: float = 60) -> list:
    """Each rank's `train(rank)` (a picklable callable: a module-level function, or a
    `functools.partial` of one), run on WORLD spawned gloo ranks, results saved in `folder`;
    the results in rank order. `timeout`: seconds a rank waits on the other in a collective."""
    args = (str(folder / "init"), str(folder), train, timeout)
    mp.spawn(_rank, args=args, nprocs=WORLD, join=True)
    return [torch.load(folder / f"{rank}.pt") for rank in range(WORLD)]
