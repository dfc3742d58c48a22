"""Small models with repeated blocks for the SAC plan tests: a transformer-style net (attention
and MLP, LayerNorm, dropout) and an MLP net (GELU or in-place ReLU, dropout); and a plan's
regions with other MUST_SAVE ops (`replanned`, `every_saveable`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import executor
from solver.sac.union import union_peak


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int, p: float = 0.1, inplace: bool = False) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.ReLU(inplace=True) if inplace else nn.GELU()
        self.fc2 = nn.Linear(hidden, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln(x)))))


class Attention(nn.Module):
    def __init__(self, d: int, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(p)
        self.mlp = MLP(d, 4 * d, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).chunk(3, -1)
        a = self.drop(torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1))
        return self.mlp(x + self.out(a @ v))


class Net(nn.Module):
    def __init__(self, blocks: list[nn.Module], d: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(d, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def sum_loss(output: torch.Tensor) -> torch.Tensor:
    """The loss the tests train their plain nets with: the sum of the output tensor."""
    return output.sum()


def transformer(layers: int = 3, d: int = 32, seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net([Attention(d) for _ in range(layers)], d).train()


def mlp_net(layers: int = 3, d: int = 32, hidden: int = 128, inplace: bool = False) -> Net:
    torch.manual_seed(0)
    return Net([MLP(d, hidden, 0.2, inplace) for _ in range(layers)], d).train()


class Summed(nn.Module):
    """`net` whose forward returns its loss, the sum of its output (the step `remat sac` and
    `remat fit` train: `executor.default_loss`)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).sum()


def small() -> tuple[Summed, tuple[torch.Tensor]]:
    """A `--model` factory: a 2-block transformer returning its loss, and its example input."""
    return Summed(transformer(layers=2)).train(), (torch.randn(2, 8, 32),)


def larger() -> tuple[Summed, tuple[torch.Tensor]]:
    """A `--model` factory: a 3-block transformer returning its loss, at a shape whose least
    peak checkpoints (its blocks' saved ops can then be offloaded)."""
    return Summed(transformer(layers=3)).train(), (torch.randn(4, 32, 32),)


def assert_same_adamw_steps(runs: list[nn.Module], loss, steps: int = 3) -> None:
    """Train the models side by side with AdamW, the same RNG seed per step (`loss(model,
    step)` returns the step's loss), and assert every run's loss, gradients and buffers
    `torch.equal` to the first run's at every step."""
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in runs]
    for step in range(steps):
        losses, grads, buffers = [], [], []
        for model, optimizer in zip(runs, optimizers, strict=True):
            torch.manual_seed(step)
            optimizer.zero_grad(set_to_none=True)
            value = loss(model, step)
            value.backward()
            losses.append(value.detach())
            grads.append([p.grad.clone() for p in model.parameters()])
            buffers.append([(n, b.clone()) for n, b in model.named_buffers()])
            optimizer.step()
        assert all(torch.equal(losses[0], x) for x in losses[1:]), f"step {step}: loss differs"
        for k, (a, *others) in enumerate(zip(*grads, strict=True)):
            assert all(torch.equal(a, b) for b in others), f"step {step}: gradient {k} differs"
        for (name, a), *others in zip(*buffers, strict=True):
            assert all(torch.equal(a, b) for _, b in others), f"step {step}: buffer {name} differs"


def replanned(
    plan: executor.CheckpointPlan,
    saved: tuple[frozenset[int], ...],
    offloaded: tuple[frozenset[int], ...] | None = None,
    plain: tuple[bool, ...] | None = None,
) -> tuple[executor.CheckpointPlan, int]:
    """The plan's regions with `saved` as their MUST_SAVE ops, `offloaded` as those of them
    offloaded and `plain` the regions not checkpointed whose saved storages wait on the host
    (per region in `plan.regions` order; None: none), and that plan's predicted peak (bytes)
    from the reference model."""
    changed = dataclasses.replace(plan, saved=saved, offloaded=offloaded, plain_offloaded=plain)
    return changed, union_peak(plan.problem, changed.union_plan())


def every_saveable(plan: executor.CheckpointPlan) -> tuple[frozenset[int], ...]:
    """Per region of the plan (`plan.regions` order): every op it may save where the plan
    checkpoints it, none elsewhere (the regions then run under SAC policies)."""
    regions = []
    for block, split in zip(plan.problem.blocks.blocks, plan.problem.splits, strict=True):
        regions += [block, *(split.children if split is not None else ())]
    return tuple(
        frozenset(i for i, op in enumerate(r.ops[: r.stop + 1]) if op.saveable and c)
        for r, c in zip(regions, plan.checkpointed, strict=True)
    )
