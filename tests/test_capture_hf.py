"""HuggingFace GPT-2, BERT and ViT (random init from a small config) capture and replay exactly."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from graph_capture import capture, eager_reference
from graph_capture.hf_models import bert, gpt2, vit

pytest.importorskip("transformers")
torch.set_num_threads(1)


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
