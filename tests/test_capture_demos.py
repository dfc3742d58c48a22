"""The CLI demo models capture exactly: bit-identical replay and byte-exact saved activations."""

from __future__ import annotations

import pytest
from capture_checks import assert_exact_replay
from saved_bytes import (
    eager_saved_bytes,
    expected_graph_saved_bytes,
    graph_saved_bytes,
)

from graph_capture import capture
from graph_capture.models.demos import MODELS, demo_model

pytestmark = pytest.mark.usefixtures("one_thread")  # exactness holds at one thread


@pytest.mark.parametrize("name", MODELS)
def test_demo_replays_bit_identical_and_saves_the_eager_bytes(name: str) -> None:
    model, inputs = demo_model(name)()
    graph = capture(model, inputs, repeats=1)
    assert graph.first_backward_index < len(graph.order)
    assert_exact_replay(model, inputs, graph)
    eager = eager_saved_bytes(model, inputs)
    assert graph_saved_bytes(graph) == expected_graph_saved_bytes(graph, model, inputs, eager)
