"""Capture measures what an op holds while it runs (its transient bytes) from real allocations,
and times each op where a step runs it."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from graph_capture import capture
from graph_capture.measurement.measure import step_drops
from graph_capture.measurement.peak import measure_each, measure_peak

pytestmark = pytest.mark.usefixtures("one_thread")


def test_measure_each_sees_a_temporary_freed_before_the_call_returns():
    def scratch_then_small() -> torch.Tensor:
        temporary = torch.ones(4096, dtype=torch.uint8)
        return temporary[:100].clone()

    (scratch,) = measure_each([scratch_then_small])
    assert scratch.end_bytes == 100
    assert scratch.peak_bytes == 4096 + 100


def test_garbage_of_earlier_work_is_not_freed_inside_a_measurement():
    """A tensor allocated in an earlier measurement and then held only by a reference cycle
    (as a compiled model's copies hold their gradients) is frozen while the next window is
    open: a collection inside the window (forced here by the call itself) finds nothing of it,
    so its free (which the profiler knows the size of) never lowers the call's peak. The
    window leaves the collector's freeze as it found it, and collects where objects are
    frozen already."""
    held: list = []

    def leave_a_cycle() -> None:
        cycle: list = [torch.zeros(4096, dtype=torch.uint8)]
        cycle.append(cycle)
        held.append(cycle)

    def call() -> list[torch.Tensor]:
        gc.collect()
        return [torch.ones(1000, dtype=torch.uint8) for _ in range(3)]

    enabled = gc.isenabled()
    gc.disable()
    try:
        measure_peak(leave_a_cycle)
        held.clear()  # only the cycle holds the tensor now
        measured = measure_peak(call)
    finally:
        if enabled:
            gc.enable()
    assert measured.peak_bytes == 3000
    assert measured.end_bytes == 0
    assert gc.get_freeze_count() == 0
    measure_peak(leave_a_cycle)
    held.clear()
    gc.freeze()  # the caller's: the window collects the cycle before it opens
    try:
        frozen = gc.get_freeze_count()
        assert measure_peak(call).peak_bytes == 3000
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_measurement_writes_nothing_to_stderr(capfd):
    """torch's profiler notices (a line at each session's start and stop) stay off stderr;
    what the measured call itself writes there still shows."""
    import sys

    def noisy() -> torch.Tensor:
        print("from the call", file=sys.stderr)
        return torch.ones(1024, dtype=torch.uint8)

    assert measure_peak(noisy).peak_bytes == 1024
    assert capfd.readouterr().err == "from the call\n"


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


def test_ops_are_timed_in_step_order_each_value_dropped_after_its_last_use():
    model, x = conv_model()
    captured = capture(model, [x], repeats=2)
    gm = captured.joint
    plan = step_drops(gm)
    (output,) = gm.graph.find_nodes(op="output")
    kept = {n.name for n in output.all_input_nodes}
    position = {node.name: k for k, (node, _) in enumerate(plan)}
    dropped = [name for _, drops in plan for name in drops]
    assert sorted(dropped) == sorted(n.name for n, _ in plan if n.name not in kept)
    by_name = {node.name: node for node, _ in plan}
    for node, drops in plan:
        for name in drops:  # dropped at its last reader, after everything that reads it
            assert all(position[u.name] <= position[node.name] for u in by_name[name].users)
