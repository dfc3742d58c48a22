"""HuggingFace GPT-2, BERT and ViT (random init from a small config) capture and replay exactly."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from graph_capture import capture, eager_reference

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

CONFIG = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2}


def gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=16,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config), (torch.randint(0, 64, (2, 12)),)


def bert() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.BertConfig(
        **CONFIG, intermediate_size=64, vocab_size=64, max_position_embeddings=16
    )
    return transformers.BertModel(config), (torch.randint(0, 64, (2, 12)),)


def vit() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.ViTConfig(**CONFIG, intermediate_size=64, image_size=16, patch_size=8)
    return transformers.ViTModel(config), (torch.randn(2, 3, 16, 16),)


@pytest.mark.parametrize("factory", [gpt2, bert, vit], ids=["gpt2", "bert", "vit"])
def test_hf_model_captures_and_replays_bit_identical(factory) -> None:
    torch.manual_seed(0)
    model, inputs = factory()
    model.train()
    graph = capture(model, inputs, repeats=1)
    assert nx.is_directed_acyclic_graph(graph.dag)
    assert graph.random_nodes, "HF configs default to dropout 0.1"
    tangents = graph.default_tangents()
    torch.manual_seed(1)
    result = graph.run_plain(model, inputs, tangents)
    torch.manual_seed(1)
    outputs, grads, _ = eager_reference(model, inputs, tangents, graph.tangent_output_indices)
    assert all(torch.equal(a, b) for a, b in zip(result.outputs, outputs, strict=True))
    for name, grad in grads.items():
        got = result.param_grads[name]
        assert (got is None and grad is None) or torch.equal(got, grad), name
