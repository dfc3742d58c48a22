"""Built-in demo models, constructed in code with random init (nothing downloaded).

Each factory returns ``(model, example_inputs)`` with the model in train mode; sizes are small
enough that capture + solve take seconds on 2 CPU cores. `graph_capture.models.demos` names them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

Factory = Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention written with explicit matmuls (every op visible)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        shape = (batch, seq, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = self.attn_drop(scores.softmax(dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(batch, seq, width)
        return self.resid_drop(self.proj(out))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention and a GELU MLP, both residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """GPT-style decoder: token + position embeddings, blocks, tied LM head; returns the loss."""

    def __init__(
        self, vocab: int = 96, seq: int = 32, width: int = 48, heads: int = 4, layers: int = 3
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.Sequential(*(Block(width, heads, 0.1) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-BN layers and a (projected) skip connection."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


class TinyResNet(nn.Module):
    """ResNet-style CNN with BatchNorm: stem, four basic blocks, pooled linear classifier."""

    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.layers = nn.Sequential(
            BasicBlock(width, width, 1),
            BasicBlock(width, 2 * width, 2),
            BasicBlock(2 * width, 2 * width, 1),
            BasicBlock(2 * width, 4 * width, 2),
        )
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.layers(self.stem(x)).mean(dim=(2, 3))
        return F.cross_entropy(self.fc(features), labels)


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1)
    )


class TinyUNet(nn.Module):
    """U-Net: two downsampling levels, a bottleneck and upsampling with concatenated skips."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        c = channels
        self.down1 = _conv_block(3, c)
        self.down2 = _conv_block(c, 2 * c)
        self.bottleneck = _conv_block(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = _conv_block(4 * c, 2 * c)
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec1 = _conv_block(2 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        s1 = self.down1(x)
        s2 = self.down2(F.max_pool2d(s1, 2))
        b = self.bottleneck(F.max_pool2d(s2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), s2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), s1], dim=1))
        return F.mse_loss(self.out(d1), target)


def gpt() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TinyGPT (3 blocks, width 48, seq 32, batch 4, dropout 0.1) and a token batch."""
    generator = torch.Generator().manual_seed(0)
    model = TinyGPT().train()
    idx = torch.randint(0, 96, (4, 32), generator=generator)
    targets = torch.randint(0, 96, (4, 32), generator=generator)
    return model, (idx, targets)


def resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TinyResNet (BatchNorm, 4 blocks, width 16) and a batch of 8 images 3x32x32."""
    generator = torch.Generator().manual_seed(0)
    model = TinyResNet().train()
    images = torch.randn(8, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (8,), generator=generator)
    return model, (images, labels)


def unet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TinyUNet (2 levels, 8 channels) and a batch of 4 images 3x32x32 with targets."""
    generator = torch.Generator().manual_seed(0)
    model = TinyUNet().train()
    images = torch.randn(4, 3, 32, 32, generator=generator)
    target = torch.randn(4, 1, 32, 32, generator=generator)
    return model, (images, target)
