"""Capture measures what an op holds while it runs (its transient bytes) from real allocations,
and calibrates op times to the step they model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from graph_capture import capture
from graph_capture.calibrate import calibrate_to_plain_run
from graph_capture.fx_nodes import phase_of
from graph_capture.measure import NodeMeasure
from graph_capture.peak import measure_each

pytestmark = pytest.mark.usefixtures("one_thread")


def test_measure_each_sees_a_temporary_freed_before_the_call_returns():
    def scratch_then_small() -> torch.Tensor:
        temporary = torch.ones(4096, dtype=torch.uint8)
        return temporary[:100].clone()

    (scratch,) = measure_each([scratch_then_small])
    assert scratch.end_bytes == 100
    assert scratch.peak_bytes == 4096 + 100


def conv_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1)
    ).train()
    return model, torch.randn(2, 3, 16, 16)


@pytest.mark.parametrize("granularity", ["op", "module"])
def test_transient_is_the_op_bytes_plus_what_the_executor_holds(granularity):
    model, x = conv_model()
    dag = capture(model, [x], granularity=granularity).dag
    held = dag.graph["held_bytes"]
    assert held["rng_states"] == 2 * torch.get_rng_state().nbytes  # one dropout, plus one
    assert held["buffer_snapshots"] == sum(b.nbytes for b in model[1].buffers())
    for v in dag:
        assert dag.nodes[v]["op_transient"] >= 0
        assert dag.nodes[v]["transient"] == dag.nodes[v]["op_transient"] + sum(held.values())
    convolutions = [v for v in dag if "convolution_backward" in dag.nodes[v]["op"]]
    if granularity == "op":  # CPU convolution backward needs a workspace beyond its gradients
        assert any(dag.nodes[v]["op_transient"] > 0 for v in convolutions)


def test_calibration_scales_the_backward_ops_to_the_plain_run_and_keeps_the_forward():
    model, x = conv_model()
    captured = capture(model, [x])
    gm = captured.joint
    args = captured.placeholder_values(model, [x], captured.default_tangents())
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    measures = {n.name: NodeMeasure({}, set(), 1e-9, 0, 0) for n in nodes}
    plain = calibrate_to_plain_run(gm, args, measures, torch.device("cpu"), repeats=2)
    forward = [measures[n.name].seconds for n in nodes if phase_of(n) == "forward"]
    assert forward == [1e-9] * len(forward)
    assert math.isclose(sum(m.seconds for m in measures.values()), plain, rel_tol=1e-9)
