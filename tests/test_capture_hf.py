"""HuggingFace GPT-2, BERT and ViT (random init from a small config) capture and replay exactly."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from capture_checks import assert_exact_replay

from graph_capture import capture
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
    assert_exact_replay(model, inputs, graph)
