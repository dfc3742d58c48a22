"""Estimate mode (capture's ``target``): bytes from fake tensors equal the measured ones node by
node, a meta-built model allocates nothing, bad input is refused, and a schedule solved in
estimate mode trains the real model bit for bit against eager."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import executor
import solver
from cli.calibrate import op_table
from cli.main import main
from executor.traced.estimated import EstimatedPeakWarning
from executor.traced.module import Rematerialized
from graph_capture import CaptureError, capture
from graph_capture.measurement.peak import measure_peak
from graph_capture.measurement.roofline import target_key
from solver.errors import ScheduleMismatchError
from solver.target import Device, UnknownTargetError

pytestmark = pytest.mark.usefixtures("one_thread")

WIDTH = 32
TOY = Device("toy", {"float32": 1e12}, bandwidth=1e11, memory=1 << 30, rounding=1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.drop = nn.Dropout(0.2)
        self.b = nn.Linear(WIDTH, WIDTH)
        self.c = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.nn.functional.gelu(self.norm(self.a(x))))
        h = h + torch.tanh(self.b(h))
        return self.c(h).square().mean()


def real_net(batch: int = 16) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net().train(), torch.randn(batch, WIDTH)


def meta_net(batch: int = 16) -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return Net().train(), torch.empty(batch, WIDTH)


@pytest.fixture(scope="module")
def both():
    model, x = real_net()
    measured = capture(model, [x], repeats=2)
    meta, mx = meta_net()
    return measured, capture(meta, [mx], target=TOY), model, x


def test_estimated_bytes_equal_measured_node_by_node(both):
    measured, estimated, _, _ = both
    assert estimated.dag.graph["target"] == "toy" and "target" not in measured.dag.graph
    assert estimated.dag.graph["structure"] == measured.dag.graph["structure"]
    assert list(estimated.dag) == list(measured.dag)
    for v in measured.dag:
        real, est = measured.dag.nodes[v], estimated.dag.nodes[v]
        assert (est["mem"], est["temp_mem"]) == (real["mem"], real["temp_mem"]), v
        assert est["op_transient"] <= real["op_transient"], v  # no kernel workspaces
        assert est["cost"] > 0 or real["op"] == "<built-in function getitem>" or est["mem"] == 0
    assert estimated.static_bytes == measured.static_bytes
    held, real_held = estimated.dag.graph["held_bytes"], measured.dag.graph["held_bytes"]
    assert held["rng_states"] == 16 * (len(measured.random_nodes) + 1)  # not "cpu": CUDA's
    assert {**held, "rng_states": 0} == {**real_held, "rng_states": 0}
    assert estimated.dag.graph["step_cost"] == pytest.approx(
        sum(estimated.dag.nodes[v]["cost"] for v in estimated.dag)
    )


def test_target_rounds_bytes_as_its_allocator(both):
    measured, _, _, _ = both
    meta, mx = meta_net()
    h100 = capture(meta, [mx], target="h100")
    for v in measured.dag:
        est, real = h100.dag.nodes[v]["mem"], measured.dag.nodes[v]["mem"]
        assert est % 512 == 0 and real <= est <= real + 512 * 4, v


def test_meta_model_captures_without_allocating():
    meta, mx = meta_net(batch=4096)  # activations of 512 KiB and more each
    capture(meta, [mx], target=TOY)  # first capture: torch's one-time initialisations
    peak = measure_peak(lambda: capture(meta, [mx], target=TOY))
    assert peak.peak_bytes < 64 << 10
    assert all(p.device.type == "meta" for p in meta.parameters())


def test_real_model_is_left_as_it_was():
    model, x = real_net()
    before = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    capture(model, [x], target=TOY)
    for n, p in model.named_parameters():
        assert p is before[n][0] and torch.equal(p, before[n][1])


def test_unknown_target_is_refused():
    meta, mx = meta_net()
    with pytest.raises(UnknownTargetError, match=r"unknown target 'tpu'.*h100"):
        capture(meta, [mx], target="tpu")


class Selects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return torch.masked_select(h, h > 0).sum()


class BuildsFromData(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table = torch.from_numpy(np.ones((WIDTH, 1024), dtype=np.float32))
        return super().forward(x) + (self.a(x) @ table).mean()


@pytest.mark.parametrize(
    ("model", "message"),
    [(Selects, "data-dependent output shape"), (BuildsFromData, "from Python data")],
)
def test_refused_in_estimate_mode(model, message):
    with torch.device("meta"):
        m, x = model().train(), torch.empty(16, WIDTH)
    with pytest.raises(CaptureError, match=message):
        capture(m, [x], target="cpu")


def train(step_model, x, steps=2):
    losses, grads = [], []
    for _ in range(steps):
        loss = step_model(x)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in step_model.parameters()])
        for p in step_model.parameters():
            p.grad = None
    return losses, grads


def test_estimated_schedule_trains_the_real_model_bit_for_bit(both, tmp_path):
    _, estimated, _, _ = both
    floor = solver.checkpoint_all_peak(solver.prepare(estimated.dag))
    schedule = solver.solve(estimated.dag, budget=int(floor * 0.6), time_limit=5)
    assert schedule.recomputes > 0 and schedule.extra["target"] == "toy"
    schedule.save(tmp_path / "s.json")
    model, x = real_net()
    eager = copy.deepcopy(model)
    rm = Rematerialized.load(tmp_path / "s.json", model, [x])
    assert rm.schedule.extra["estimated_peak"] == schedule.peak
    torch.manual_seed(1)
    with pytest.warns(EstimatedPeakWarning, match="measured peak"):
        got = train(rm, x)
    torch.manual_seed(1)
    want = train(eager, x)
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0], strict=True))
    for g, w in zip(got[1], want[1], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(g, w, strict=True))
    check = rm.estimate_check
    assert check.predicted_bytes == schedule.peak and check.measured_bytes > 0
    assert check.measured_bytes <= check.capture_bytes


def test_estimated_schedule_for_other_shapes_is_refused(both, tmp_path):
    _, estimated, _, _ = both
    solver.solve(estimated.dag, budget="100%", time_limit=2).save(tmp_path / "s.json")
    model, x = real_net(batch=8)
    with pytest.raises(ScheduleMismatchError, match=r"estimate mode.*other ops, shapes"):
        Rematerialized.load(tmp_path / "s.json", model, [x])


def test_calibrated_table_gives_the_measured_op_seconds(both):
    measured, _, _, _ = both
    table = op_table(measured)
    calibrated = Device("cpu", {"float32": 1e12}, 1e11, 1 << 30, rounding=1, op_seconds=table)
    meta, mx = meta_net()
    estimated = capture(meta, [mx], target=calibrated)
    ops = [n for n in measured.joint.graph.nodes if n.meta.get("remat_seconds")]
    assert ops and len(table) <= len(ops)
    for node in ops:
        if measured.members.get(node.name) == [node.name]:  # a node of one op
            assert estimated.dag.nodes[node.name]["cost"] >= table[_key(node)]  # + a .grad add


def _key(node):
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    return target_key(node.target, args, kwargs)


def test_cli_refuses_an_unknown_target(capsys):
    assert main(["solve", "--demo", "gpt", "--target", "tpu", "--budget", "50%"]) == 2
    assert "unknown target 'tpu'" in capsys.readouterr().err


def test_fit_in_estimate_mode_runs_nothing():
    found = executor.fit(meta_net, "200KiB", dim="batch", target=TOY, time_limit=30)
    assert found.size is not None and found.proven and found.measured_peak is None
    assert found.eager_size is None and "estimate mode for target 'toy'" in found.notes[-1]
    assert found.static.optimizer_state == 2 * found.static.gradients > 0
