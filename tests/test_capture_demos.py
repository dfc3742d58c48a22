"""The CLI demo models capture exactly: bit-identical replay and byte-exact saved activations."""

from __future__ import annotations

import pytest
import torch

from graph_capture import capture, eager_reference
from graph_capture.accounting import (
    eager_saved_bytes,
    expected_graph_saved_bytes,
    graph_saved_bytes,
)
from graph_capture.demo_models import DEMOS

torch.set_num_threads(1)


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demo_replays_bit_identical_and_saves_the_eager_bytes(name: str) -> None:
    model, inputs = DEMOS[name]()
    graph = capture(model, inputs, repeats=1)
    assert graph.first_backward_index < len(graph.order)
    tangents = graph.default_tangents()
    torch.manual_seed(11)
    result = graph.run_plain(model, inputs, tangents)
    torch.manual_seed(11)
    outputs, grads, _ = eager_reference(model, inputs, tangents, graph.tangent_output_indices)
    assert all(torch.equal(a, b) for a, b in zip(result.outputs, outputs, strict=True))
    assert all(torch.equal(result.param_grads[k], g) for k, g in grads.items())
    eager = eager_saved_bytes(model, inputs)
    assert graph_saved_bytes(graph) == expected_graph_saved_bytes(graph, model, inputs, eager)
