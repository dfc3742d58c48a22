"""Kernel workspaces and the percent basis in estimate mode: for target ``cpu`` both estimate
paths (the traced graph's ``op_transient``, the SAC recording's windows) count at least the
workspace measured on real tensors, a calibrated table gives the measured bytes, and 100% is the
predicted plain step, named so."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import executor
import solver
from cli.calibrate import transient_table
from graph_capture import capture
from graph_capture.measurement.roofline import cpu_device
from solver.core.budget import PREDICTED_PLAIN_STEP, hundred_percent
from solver.errors import InfeasibleBudgetError

pytestmark = pytest.mark.usefixtures("one_thread")


class ConvNet(nn.Module):
    """Convolutions, BatchNorm, LayerNorm and dropout: ops whose CPU kernels hold workspaces."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(torch.relu(self.bn(self.conv(x))))
        h = self.drop(self.norm(h.mean((2, 3))))
        return self.head(h).square().mean()


def _net() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return ConvNet().train(), torch.randn(4, 8, 12, 12)


@pytest.fixture(scope="module")
def graphs():
    model, x = _net()
    return capture(model, [x], repeats=2), capture(model, [x], target="cpu"), model, x


def test_estimated_transients_bound_the_measured_ones(graphs):
    measured, estimated, _, _ = graphs
    workspaces = 0
    for v in measured.dag:
        real, est = measured.dag.nodes[v]["op_transient"], estimated.dag.nodes[v]["op_transient"]
        assert est >= real, (v, est, real)
        workspaces += real > 0
    assert workspaces >= 5  # the convolutions and their backward, BatchNorm, LayerNorm, dropout
    plain = solver.checkpoint_all_peak(solver.prepare(measured.dag))
    assert solver.checkpoint_all_peak(solver.prepare(estimated.dag)) >= plain


def test_calibrated_workspaces_are_the_measured_bytes(graphs):
    measured, _, model, x = graphs
    device = dataclasses.replace(cpu_device(), op_transient=transient_table(measured))
    calibrated = capture(model, [x], target=device)
    for v in measured.dag:
        assert calibrated.dag.nodes[v]["op_transient"] == measured.dag.nodes[v]["op_transient"]


def test_estimate_mode_hundred_percent_is_the_predicted_plain_step(graphs):
    _, estimated, _, _ = graphs
    graph = estimated.dag.graph
    assert graph["plain_peak_basis"] == "predicted"
    problem = solver.prepare(estimated.dag)
    assert graph["plain_peak"] == solver.checkpoint_all_peak(problem)
    assert hundred_percent(problem) == (graph["plain_peak"], PREDICTED_PLAIN_STEP)
    with pytest.raises(InfeasibleBudgetError, match="of the predicted plain step"):
        solver.solve(estimated.dag, budget="1%", time_limit=10)


def test_sac_estimate_counts_workspaces_and_names_its_basis():
    from benchmarks.zoo import resnet18

    model, inputs = resnet18(batch=2, image=16, classes=4, width=8)
    measured = executor.checkpoint_plan(model, inputs, "min", time_limit=30)
    estimated = executor.checkpoint_plan(model, inputs, "min", time_limit=30, target="cpu")
    assert estimated.plain_peak >= measured.plain_peak  # workspaces in the windows' peaks
    assert estimated.peak >= measured.peak
    scratch = [o.scratch for b in estimated.problem.blocks.blocks for o in b.ops]
    assert max(scratch) > 0
    assert "the predicted plain step" in repr(estimated)
    assert "the measured plain step" in repr(measured)
    with pytest.raises(InfeasibleBudgetError, match="of the predicted plain step"):
        executor.checkpoint_plan(model, inputs, 1, time_limit=30, target="cpu")
