"""HuggingFace transformers models built from small configs with random init (nothing downloaded).

Factories for ``--model graph_capture.models.hf_models:gpt2_lm`` (``llama_lm``, ``bert_mlm``,
``vit_classifier``, ``t5_lm``, ``bloom_lm``); each returns ``(model, example_inputs,
example_kwargs)``: the model with its task head and its default config (``use_cache`` left as it
is), called the way training loops call it, ``model(*example_inputs, **example_kwargs)`` with
``labels=`` (and ``attention_mask=``), so that the output's ``loss`` is the training loss. Needs
transformers (the ``hf`` extra; the ``test`` extra has it too). The benchmark models at real
sizes are `benchmarks.zoo`.
"""

from __future__ import annotations

import torch
from torch import nn

from graph_capture.errors import CaptureError

VOCAB = 128

ModelCall = tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]
"""A model and the positional and keyword arguments of one call of it."""


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise CaptureError(
            "HuggingFace models need transformers: pip install -e '.[hf]'"
        ) from error
    return transformers


def _tokens(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def gpt2_lm(batch: int = 2, seq: int = 16, layers: int = 2, width: int = 32) -> ModelCall:
    """GPT2LMHeadModel with its default config, called with ``labels=`` (next-token loss)."""
    t = _transformers()
    config = t.GPT2Config(n_layer=layers, n_embd=width, n_head=2, vocab_size=VOCAB, n_positions=seq)
    ids = _tokens(batch, seq)
    return t.GPT2LMHeadModel(config).train(), (ids,), {"labels": ids}


def llama_lm(
    batch: int = 2, seq: int = 16, layers: int = 2, width: int = 32, kv_heads: int = 2
) -> ModelCall:
    """LlamaForCausalLM with its default config (no dropout: Llama has none), ``labels=``;
    2 query heads over ``kv_heads`` key/value heads (1: grouped-query attention)."""
    t = _transformers()
    config = t.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=width,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        intermediate_size=2 * width,
        vocab_size=VOCAB,
        max_position_embeddings=seq,
    )
    ids = _tokens(batch, seq)
    return t.LlamaForCausalLM(config).train(), (ids,), {"labels": ids}


def bert_mlm(batch: int = 2, seq: int = 16, layers: int = 2, width: int = 32) -> ModelCall:
    """BertForMaskedLM called with ``attention_mask=`` and ``labels=`` (-100 where unmasked)."""
    t = _transformers()
    config = t.BertConfig(
        num_hidden_layers=layers,
        hidden_size=width,
        num_attention_heads=2,
        intermediate_size=2 * width,
        vocab_size=VOCAB,
        max_position_embeddings=seq,
    )
    ids = _tokens(batch, seq)
    masked = torch.rand(batch, seq, generator=torch.Generator().manual_seed(1)) < 0.15
    masked[:, 0] = True
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, -3:] = 0  # padding at the end of the first sequence
    kwargs = {"attention_mask": mask, "labels": labels}
    return t.BertForMaskedLM(config).train(), (ids.masked_fill(masked, 0),), kwargs


def vit_classifier(batch: int = 2, image: int = 32, layers: int = 2, width: int = 32) -> ModelCall:
    """ViTForImageClassification (3 classes, 8x8 patches) called with ``labels=``."""
    t = _transformers()
    config = t.ViTConfig(
        num_hidden_layers=layers,
        hidden_size=width,
        num_attention_heads=2,
        intermediate_size=2 * width,
        image_size=image,
        patch_size=8,
        num_labels=3,
    )
    pixels = torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(batch) % 3
    return t.ViTForImageClassification(config).train(), (pixels,), {"labels": labels}


def t5_lm(batch: int = 2, seq: int = 16, layers: int = 1, width: int = 32) -> ModelCall:
    """T5ForConditionalGeneration (encoder-decoder) called with ``labels=``; the decoder's
    inputs are the labels shifted right, as in training."""
    t = _transformers()
    config = t.T5Config(
        num_layers=layers,
        num_decoder_layers=layers,
        d_model=width,
        d_kv=width // 2,
        num_heads=2,
        d_ff=2 * width,
        vocab_size=VOCAB,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    ids, labels = _tokens(batch, seq), _tokens(batch, seq // 2, seed=1)
    return t.T5ForConditionalGeneration(config).train(), (ids,), {"labels": labels}


def bloom_lm(batch: int = 2, seq: int = 8, layers: int = 2, width: int = 32) -> ModelCall:
    """BloomForCausalLM with dropout 0.1 (its config's default is none), ``labels=``; its MLP's
    GeLU is a custom autograd.Function (``GeLUFunction``) in training mode."""
    t = _transformers()
    config = t.BloomConfig(
        n_layer=layers,
        hidden_size=width,
        n_head=4,
        vocab_size=VOCAB,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )
    ids = _tokens(batch, seq)
    return t.BloomForCausalLM(config).train(), (ids,), {"labels": ids}
