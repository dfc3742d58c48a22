"""Models the estimate tests draw: a transformer stack, a CNN and Hugging Face families, each
as (model, inputs, loss)."""

from __future__ import annotations

import torch
from sac_models import sum_loss, transformer
from torch import nn


class ConvNet(nn.Module):
    """A stem convolution, `layers` conv-ReLU blocks and a linear head."""

    def __init__(self, layers: int, channels: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU())
            for _ in range(layers)
        )
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


def _hf_model(family: str, layers: int, width: int, batch: int, seq: int):
    from benchmarks.zoo import hf

    bench = getattr(hf, family)(layers=layers, hidden=width, batch=batch, seq=seq)
    model, inputs = bench
    return model, inputs, lambda out: out


def drawn_model(family: str, layers: int, width: int, batch: int, seq: int):
    """(model, inputs, loss) of a drawn case."""
    torch.manual_seed(0)
    if family == "transformer":
        return transformer(layers=layers, d=width), (torch.randn(batch, seq, width),), sum_loss
    if family == "cnn":
        return ConvNet(layers, width), (torch.randn(batch, 3, seq, seq),), sum_loss
    return _hf_model(family, layers, width, batch, seq)
