"""SAC plans under FSDP2 and DDP on 2 gloo ranks (CPU), spawned by `benchmarks.gloo_ranks`.

The plans are solved in the parent and saved; each rank loads them (`CheckpointPlan.load`),
applies them, then wraps: FSDP2 around HF GPT-2 (dropout on) as torchtitan does (checkpoint
first, then `fully_shard` per block and on the root), DDP around a small transformer. Per rank,
different data and dropout streams; after each of 3 AdamW steps the gradients (`full_tensor()`
for FSDP2) are `torch.equal` to the same wrapper around the model without checkpointing.
"""

from __future__ import annotations

import copy
import os
from functools import partial

import pytest
import torch
from sac_models import every_saveable, replanned, sum_loss, transformer

import executor
import executor.sac.plan
from benchmarks.gloo_ranks import WORLD, on_gloo_ranks

STEPS = 3


def _grads(model) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        g = p.grad
        out.append(g.full_tensor() if hasattr(g, "full_tensor") else g.clone())
    return out


def _train(runs, rank: int, batch, loss_fn) -> list[list[list[torch.Tensor]]]:
    """Each step's gradients of each run, on this rank's data and dropout stream; `batch(g)`
    draws a step's inputs from the generator `g`, `loss_fn(output)` is the step's loss."""
    data = torch.Generator().manual_seed(100 + rank)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in runs]
    record = []
    for step in range(STEPS):
        args, kwargs = batch(data)
        grads = []
        for model, optimizer in zip(runs, optimizers, strict=True):
            torch.manual_seed(1000 * step + rank)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(*args, **kwargs)).square().backward()
            grads.append(_grads(model))
            optimizer.step()
        record.append(grads)
    return record


def gpt2():
    from graph_capture.models.hf_models import gpt2_lm

    torch.manual_seed(0)
    model, args, kwargs = gpt2_lm(batch=2, seq=16, layers=2, width=32)
    return model, args, {**kwargs, "use_cache": False}


def _tokens(g: torch.Generator):
    ids = torch.randint(0, 128, (2, 16), generator=g)
    return (ids,), {"labels": ids, "use_cache": False}


def train(plan_dir: str, rank: int) -> dict:
    """FSDP2 around GPT-2 and DDP around a small transformer, each without and with its plan:
    every step's gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    hf, _, _ = gpt2()
    plan = executor.CheckpointPlan.load(os.path.join(plan_dir, "gpt2.json"), hf)
    mesh = init_device_mesh("cpu", (WORLD,))
    fsdp = []
    for model in (copy.deepcopy(hf), plan.apply(copy.deepcopy(hf))):
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fsdp.append(fully_shard(model, mesh=mesh))
    net = transformer(layers=2)
    plan = executor.CheckpointPlan.load(os.path.join(plan_dir, "net.json"), net)
    ddp = [
        DistributedDataParallel(copy.deepcopy(net)),
        DistributedDataParallel(plan.apply(copy.deepcopy(net))),
    ]
    return {
        "fsdp": _train(fsdp, rank, _tokens, executor.default_loss),  # output.loss
        "ddp": _train(ddp, rank, lambda g: ((torch.randn(4, 16, 32, generator=g),), {}), sum_loss),
    }


@pytest.mark.usefixtures("one_thread")
def test_fsdp2_and_ddp_with_a_plan_match_them_without(tmp_path):
    pytest.importorskip("transformers")
    model, args, kwargs = gpt2()
    plan = executor.checkpoint_plan(
        model, args, "80%", example_kwargs=kwargs, blocks=["transformer.h.*"], time_limit=60
    )
    assert plan.checkpointed_regions()
    plan, _ = replanned(plan, every_saveable(plan))  # its regions under SAC policies
    assert any(plan.saved)
    plan.save(tmp_path / "gpt2.json")
    plan = executor.checkpoint_plan(
        transformer(layers=2), (torch.randn(4, 16, 32),), "min", time_limit=60, loss_fn=sum_loss
    )
    assert plan.checkpointed_regions()
    plan.save(tmp_path / "net.json")
    for rank, result in enumerate(on_gloo_ranks(partial(train, str(tmp_path)), tmp_path)):
        for wrapper, record in result.items():
            for step, (plain, planned) in enumerate(record):
                for k, (a, b) in enumerate(zip(plain, planned, strict=True)):
                    assert torch.equal(a, b), f"{wrapper} rank {rank} step {step}: grad {k}"
