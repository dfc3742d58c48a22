"""HuggingFace transformers models built from small configs with random init (nothing downloaded).

Factories for ``--model graph_capture.hf_models:gpt2`` (``bert``, ``vit``); each returns
``(model, example_inputs)`` in train mode (dropout 0.1 as the configs default). Needs the ``hf``
extra (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import torch
from torch import nn

from graph_capture.errors import CaptureError

WIDTH = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise CaptureError(
            "HuggingFace models need transformers: pip install -e '.[hf]'"
        ) from error
    return transformers


def gpt2(batch: int = 2, seq: int = 16) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPT2LMHeadModel, 2 layers, width 64, vocab 128 (``use_cache=False``: export needs it)."""
    t = _transformers()
    config = t.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=seq,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
    return t.GPT2LMHeadModel(config).train(), (ids,)


def bert(batch: int = 2, seq: int = 16) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BertModel, 2 layers, width 64, vocab 128."""
    t = _transformers()
    config = t.BertConfig(
        **WIDTH, intermediate_size=128, vocab_size=128, max_position_embeddings=seq
    )
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
    return t.BertModel(config).train(), (ids,)


def vit(batch: int = 2, image: int = 32) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ViTModel, 2 layers, width 64, 8x8 patches of ``image``x``image`` RGB images."""
    t = _transformers()
    config = t.ViTConfig(**WIDTH, intermediate_size=128, image_size=image, patch_size=8)
    pixels = torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(0))
    return t.ViTModel(config).train(), (pixels,)
