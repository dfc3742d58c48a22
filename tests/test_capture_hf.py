"""HuggingFace GPT-2, Llama, BERT and ViT of the zoo (random init, tiny configs, called with
``labels=`` through `HFLoss`) capture and replay exactly."""

from __future__ import annotations

import networkx as nx
import pytest
from capture_checks import assert_exact_replay

from benchmarks.zoo import hf
from graph_capture import capture

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # exactness holds at one thread

TINY = {"layers": 1, "hidden": 32, "heads": 2, "batch": 2}


@pytest.mark.parametrize(
    "factory, shape",
    [
        (hf.gpt2, {"seq": 16, "vocab": 128}),
        (hf.llama, {"seq": 16, "vocab": 128, "kv_heads": 1}),
        (hf.bert, {"seq": 16, "vocab": 128}),
        (hf.vit, {"image": 32}),
    ],
    ids=["gpt2", "llama", "bert", "vit"],
)
def test_hf_model_captures_and_replays_bit_identical(factory, shape: dict) -> None:
    model, inputs = factory(**TINY, **shape)
    graph = capture(model, inputs, repeats=1)
    assert nx.is_directed_acyclic_graph(graph.dag)
    assert graph.random_nodes, "every zoo model has dropout 0.1 on"
    assert_exact_replay(model, inputs, graph)
