"""Checks shared by the capture tests."""

from __future__ import annotations

import torch
from torch import nn

from graph_capture import CapturedGraph, eager_reference


def assert_exact_replay(model: nn.Module, inputs: tuple, graph: CapturedGraph) -> None:
    """Plain run of the joint graph == eager forward+backward, bit for bit (same RNG seed)."""
    tangents = graph.default_tangents()
    before = {k: v.clone() for k, v in model.named_buffers()}
    torch.manual_seed(123)
    result = graph.run_plain(model, inputs, tangents)
    torch.manual_seed(123)
    outputs, grads, input_grads = eager_reference(
        model, inputs, tangents, graph.tangent_output_indices
    )
    assert len(result.outputs) == len(outputs)
    for got, want in zip(result.outputs, outputs, strict=True):
        assert torch.equal(got, want)
    assert set(result.param_grads) == set(grads)
    for name, grad in grads.items():
        got = result.param_grads[name]
        assert (got is None and grad is None) or torch.equal(got, grad), name
    for index, grad in result.input_grads.items():
        assert torch.equal(grad, input_grads[index])
    for name, value in result.buffer_updates.items():
        assert not torch.equal(value, before[name]) or name.endswith("num_batches_tracked")
        assert torch.equal(value, dict(model.named_buffers())[name]), name
