"""DistributedDataParallel around a Rematerialized model trains exactly as DDP around the model.

Two gloo processes on the CPU (spawned), different data and dropout streams per rank: after
each of 3 steps the all-reduced gradients of DDP(rematerialize(model)) are `torch.equal` to
those of DDP(model), on both ranks, and every post-accumulate-grad hook fired once per parameter
per step. This guards the torch behaviour the executor relies on (docs/training.md): the step's
autograd Function returns no gradient for the parameters, writes `.grad` itself, and autograd
still runs each parameter's AccumulateGrad node, whose hooks (DDP's included) then fire.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from benchmarks.gloo_ranks import on_gloo_ranks

STEPS = 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64),
        nn.Dropout(0.2),
        nn.GELU(),
        nn.Linear(64, 64),
        nn.LayerNorm(64),
        nn.Dropout(0.1),
        nn.GELU(),
        nn.Linear(64, 32),
    ).train()


def train(rank: int) -> dict:
    """DDP(model) and DDP(rematerialized copy) side by side on this rank's data: each step's
    gradients and the hook counts, and how many recomputes the schedule makes."""
    import executor

    data = torch.Generator().manual_seed(100 + rank)  # different data per rank
    example = torch.randn(128, 32, generator=data)
    model = make_model()
    rm = executor.rematerialize(
        copy.deepcopy(model), [example], "75%", capture_options={"repeats": 1}, time_limit=20
    )
    recomputes = len(rm.schedule.ops) - 2 * rm.captured.dag.number_of_nodes()
    fired = {name: 0 for name, _ in rm.named_parameters()}
    for name, p in rm.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _, n=name: fired.__setitem__(n, fired[n] + 1))
    runs = [DistributedDataParallel(model), DistributedDataParallel(rm)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in runs]
    record = []
    for step in range(STEPS):
        x = torch.randn(128, 32, generator=data)
        grads = []
        for ddp, optimizer in zip(runs, optimizers, strict=True):
            torch.manual_seed(1000 * step + rank)  # each rank's own dropout stream
            optimizer.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()
            grads.append([p.grad.clone() for p in ddp.parameters()])
            optimizer.step()
        record.append({"grads": grads, "fired": dict(fired)})
    return {"record": record, "recomputes": recomputes}


def test_ddp_around_rematerialized_model_matches_ddp_around_the_model(tmp_path):
    ranks = on_gloo_ranks(train, tmp_path)
    for rank, result in enumerate(ranks):
        assert result["recomputes"] > 0, f"rank {rank}: the 75% schedule recomputes nothing"
        for step, entry in enumerate(result["record"]):
            plain, remat = entry["grads"]
            for k, (a, b) in enumerate(zip(plain, remat, strict=True)):
                assert torch.equal(a, b), f"rank {rank} step {step}: grad {k} differs"
            assert set(entry["fired"].values()) == {step + 1}, (rank, step, entry["fired"])
    for step in range(STEPS):  # all-reduced: both ranks hold the same (averaged) gradients
        first, second = (result["record"][step]["grads"][1] for result in ranks)
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a, b), f"step {step}: ranks disagree after the all-reduce"
