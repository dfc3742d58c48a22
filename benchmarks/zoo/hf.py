"""HuggingFace transformers models built from small configs with random init (nothing is
downloaded): GPT-2, Llama, BERT and ViT, each called as its users call it (``labels=``, the
output's ``.loss``). Needs transformers (the ``hf`` extra).

Causal LMs are configured with ``use_cache=False``, as training runs them: with the cache on,
the model also returns every layer's keys and values, which a training step does not use.

Every factory takes ``layers`` (the repeated transformer blocks; the registry has 4, 12 and 24)
and a width small enough that 24 layers step in about a second on one CPU thread; dropout is
``dropout`` (0.1, the GPT-2/BERT default) on every dropout site the config has, and the model is
in train mode, so dropout runs.
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo.bench import Bench, HFLoss, image_batch


def _language_model(model: nn.Module, blocks: nn.ModuleList, batch: int, seq: int) -> Bench:
    """`model` in train mode called with ``input_ids`` and ``labels`` (fixed token ids
    ``(batch, seq)``, the labels equal to the inputs: the model shifts or masks them)."""
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    return Bench(HFLoss(model.train(), ("input_ids", "labels")), (ids, ids.clone()), list(blocks))


def gpt2(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    batch: int = 4,
    seq: int = 64,
    vocab: int = 1024,
    dropout: float = 0.1,
) -> Bench:
    """GPT2LMHeadModel (tied head), LM loss on ``labels=input_ids``; blocks: ``transformer.h``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        vocab_size=vocab,
        n_positions=seq,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    return _language_model(model, model.transformer.h, batch, seq)


def llama(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    batch: int = 4,
    seq: int = 64,
    vocab: int = 1024,
    dropout: float = 0.1,
) -> Bench:
    """LlamaForCausalLM (RMSNorm, rotary embeddings, SwiGLU MLP of width ``8/3 * hidden``
    rounded to 64, grouped-query attention with ``kv_heads``), LM loss on
    ``labels=input_ids``; ``dropout`` is the attention dropout (Llama has no other); blocks:
    ``model.layers``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=(8 * hidden // 3 + 63) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=seq,
        attention_dropout=dropout,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = LlamaForCausalLM(config)
    return _language_model(model, model.model.layers, batch, seq)


def bert(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    batch: int = 4,
    seq: int = 64,
    vocab: int = 1024,
    dropout: float = 0.1,
) -> Bench:
    """BertForMaskedLM (MLP width ``4 * hidden``), masked-LM loss with every position labelled
    (``labels=input_ids``); blocks: ``bert.encoder.layer``."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    model = BertForMaskedLM(config)
    return _language_model(model, model.bert.encoder.layer, batch, seq)


def vit(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    batch: int = 4,
    image: int = 64,
    patch: int = 8,
    classes: int = 10,
    dropout: float = 0.1,
) -> Bench:
    """ViTForImageClassification (MLP width ``4 * hidden``, ``(image / patch)**2`` patches plus
    the class token), cross-entropy on ``labels=``; blocks: ``vit.layers``."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=image,
        patch_size=patch,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=classes,
    )
    model = ViTForImageClassification(config).train()
    wrapped = HFLoss(model, ("pixel_values", "labels"))
    return Bench(wrapped, image_batch(batch, image, classes), list(model.vit.layers))
