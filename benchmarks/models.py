"""Models the benchmarks capture and run: the demo models, a uniform block stack, narrow
4-layer HuggingFace GPT-2, BERT and ViT (the zoo's factories at width 64; need the `hf` extra),
and every model of the zoo (`benchmarks.zoo`) under its zoo name.

Each factory returns a `Bench`: the model (train mode), example inputs, and the repeated blocks a
user would wrap in `torch.utils.checkpoint` (None when the model has no block list).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from benchmarks import zoo
from benchmarks.zoo import ZOO, Bench
from graph_capture.models.demos import demo_model


def _demo(name: str, blocks: Callable[[nn.Module], list[nn.Module]]) -> Callable[[], Bench]:
    def make() -> Bench:
        model, inputs = demo_model(name)()
        return Bench(model, inputs, blocks(model))

    return make


def mlp_block(width: int) -> nn.Module:
    """One block of the uniform stacks: Linear, GELU, LayerNorm (the norm keeps activations at
    unit scale; without it 64 plain blocks decay into denormal floats that run many times
    slower on CPU and swamp every timing)."""
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))


def uniform_stack(n: int, width: int = 128, batch: int = 64) -> Bench:
    """n identical `mlp_block`s and a mean-square loss."""

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(*(mlp_block(width) for _ in range(n)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks(x).square().mean()

    torch.manual_seed(0)
    model = Stack().train()
    return Bench(model, (torch.randn(batch, width),), list(model.blocks))


MODELS: dict[str, Callable[[], Bench]] = {
    "gpt": _demo("gpt", lambda m: list(m.blocks)),
    "resnet": _demo("resnet", lambda m: list(m.layers)),
    "unet": _demo("unet", lambda m: [m.down1, m.down2, m.bottleneck, m.dec2, m.dec1]),
    "stack16": lambda: uniform_stack(16),
    "stack48": lambda: uniform_stack(48),
    "stack64": lambda: uniform_stack(64),
    "gpt2": partial(zoo.gpt2, hidden=64, vocab=256, seq=32),
    "bert": partial(zoo.bert, hidden=64, vocab=256, seq=32),
    "vit": partial(zoo.vit, hidden=64, image=32),
    **ZOO,
}
"""Every benchmark model by name; gpt2/bert/vit and the zoo's transformers need
`pip install -e .[hf]`."""
