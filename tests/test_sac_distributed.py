"""SAC plans under FSDP2 and DDP on 2 gloo ranks (CPU), spawned as in test_executor_ddp.py.

The plan is solved in the parent and saved; each rank loads it (`CheckpointPlan.load`), applies
it, then wraps: FSDP2 as torchtitan does (checkpoint first, then `fully_shard` per block and on
the root), DDP around the model. Per rank, different data and dropout streams; after each of 3
AdamW steps the gradients (`full_tensor()` for FSDP2) are `torch.equal` to the same wrapper
around the model without checkpointing."""

from __future__ import annotations

import copy
import datetime
import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sac_models import transformer

import executor

WORLD = 2
STEPS = 3


def _grads(model) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        g = p.grad
        out.append(g.full_tensor() if hasattr(g, "full_tensor") else g.clone())
    return out


def _train(runs, rank: int) -> list[list[list[torch.Tensor]]]:
    """Each step's gradients of each run, on this rank's data and dropout stream."""
    data = torch.Generator().manual_seed(100 + rank)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in runs]
    record = []
    for step in range(STEPS):
        x = torch.randn(4, 16, 32, generator=data)
        grads = []
        for model, optimizer in zip(runs, optimizers, strict=True):
            torch.manual_seed(1000 * step + rank)
            optimizer.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            grads.append(_grads(model))
            optimizer.step()
        record.append(grads)
    return record


def run_rank(rank: int, init_file: str, plan_file: str, results: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        net = transformer(layers=2)
        plan = executor.CheckpointPlan.load(plan_file, net)
        mesh = init_device_mesh("cpu", (WORLD,))
        fsdp = []
        for model in (copy.deepcopy(net), plan.apply(copy.deepcopy(net))):
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fsdp.append(fully_shard(model, mesh=mesh))
        ddp = [
            DistributedDataParallel(copy.deepcopy(net)),
            DistributedDataParallel(plan.apply(copy.deepcopy(net))),
        ]
        result = {"fsdp": _train(fsdp, rank), "ddp": _train(ddp, rank)}
        del fsdp, ddp
        gc.collect()
        torch.save(result, os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_thread")
def test_fsdp2_and_ddp_with_a_plan_match_them_without(tmp_path):
    net = transformer(layers=2)
    plan = executor.checkpoint_plan(net, (torch.randn(4, 16, 32),), "min", time_limit=10)
    assert plan.checkpointed()
    plan.save(tmp_path / "plan.json")
    args = (str(tmp_path / "init"), str(tmp_path / "plan.json"), str(tmp_path))
    mp.spawn(run_rank, args=args, nprocs=WORLD, join=True)
    for rank in range(WORLD):
        result = torch.load(tmp_path / f"{rank}.pt")
        for wrapper, record in result.items():
            for step, (plain, planned) in enumerate(record):
                for k, (a, b) in enumerate(zip(plain, planned, strict=True)):
                    assert torch.equal(a, b), f"{wrapper} rank {rank} step {step}: grad {k}"
