"""Models the benchmarks capture and run: the demo models, a uniform block stack, and
HuggingFace GPT-2, BERT and ViT built from small configs with random init (needs the `hf` extra).

Each factory returns a `Bench`: the model (train mode), example inputs, and the repeated blocks a
user would wrap in `torch.utils.checkpoint` (None when the model has no block list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from graph_capture.demos import demo_model


@dataclass
class Bench:
    """A model whose forward returns the scalar loss, its inputs and its checkpointable blocks."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    blocks: list[nn.Module] | None


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


class _HFLoss(nn.Module):
    """Wrap a HuggingFace model so that forward(*tensors) returns its loss."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...], **fixed: object) -> None:
        super().__init__()
        self.model, self.keys, self.fixed = model, keys, fixed

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.keys, tensors, strict=True)), **self.fixed).loss


def hf_gpt2() -> Bench:
    """GPT-2 (4 layers, width 64, 4 heads, vocab 256), batch 4 x 32 tokens, LM loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4,
        n_embd=64,
        n_head=4,
        vocab_size=256,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 256, (4, 32))
    wrapped = _HFLoss(model, ("input_ids", "labels"), use_cache=False)
    return Bench(wrapped, (ids, ids.clone()), list(model.transformer.h))


def hf_bert() -> Bench:
    """BERT masked LM (4 layers, width 64, 4 heads, vocab 256), batch 4 x 32 tokens."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    model = BertForMaskedLM(config).train()
    ids = torch.randint(0, 256, (4, 32))
    wrapped = _HFLoss(model, ("input_ids", "labels"))
    return Bench(wrapped, (ids, ids.clone()), list(model.bert.encoder.layer))


def hf_vit() -> Bench:
    """ViT classifier (4 layers, width 64, 4 heads, 32x32 images, patch 8), batch 4."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
    )
    model = ViTForImageClassification(config).train()
    pixels, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    layers = model.vit.layers if hasattr(model.vit, "layers") else model.vit.encoder.layer
    return Bench(_HFLoss(model, ("pixel_values", "labels")), (pixels, labels), list(layers))


MODELS: dict[str, Callable[[], Bench]] = {
    "gpt": _demo("gpt", lambda m: list(m.blocks)),
    "resnet": _demo("resnet", lambda m: list(m.layers)),
    "unet": _demo("unet", lambda m: [m.down1, m.down2, m.bottleneck, m.dec2, m.dec1]),
    "stack16": lambda: uniform_stack(16),
    "stack48": lambda: uniform_stack(48),
    "stack64": lambda: uniform_stack(64),
    "gpt2": hf_gpt2,
    "bert": hf_bert,
    "vit": hf_vit,
}
"""Every benchmark model by name; gpt2/bert/vit need `pip install -e .[hf]`."""
