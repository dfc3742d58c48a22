"""Small models for executor.compile's tests: a GPT (causal attention written with
explicit matmuls, LayerNorm, a GELU MLP, optional dropout, cross-entropy) and a CNN with
BatchNorm; each forward returns the loss."""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=-1)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        attn = self.drop(scores.masked_fill(~mask, float("-inf")).softmax(-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, t, w))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, pre-LayerNorm blocks, a head and cross-entropy."""

    def __init__(
        self,
        vocab: int = 32,
        seq: int = 16,
        width: int = 32,
        heads: int = 2,
        layers: int = 2,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln(self.blocks(x)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class CNN(nn.Module):
    """Two convolution blocks with BatchNorm and ReLU, pooled into a linear classifier."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()

        def block(c_in: int, c_out: int) -> nn.Sequential:
            conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
            return nn.Sequential(conv, nn.BatchNorm2d(c_out), nn.ReLU())

        self.features = nn.Sequential(block(3, channels), block(channels, channels))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pooled = self.features(x).mean(dim=(2, 3))
        return nn.functional.cross_entropy(self.head(pooled), targets)
