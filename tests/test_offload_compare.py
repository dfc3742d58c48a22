"""The whole-activation offload baselines of benchmarks/running/offload_compare_baselines.py: the
hooks copy exactly (gradients `torch.equal` to eager's), their host bytes are counted from the
pool, and torchtune's copies as ops on the keep-all schedule
(benchmarks/running/offload_compare_predict.py) are a valid schedule."""

from __future__ import annotations

import copy

import torch
from torch import nn

import solver
from benchmarks.running.offload_compare_baselines import (
    SaveOnCpu,
    TorchtuneOffload,
    hooked_step,
    loss_step,
    step_gradients,
)
from benchmarks.running.offload_compare_predict import torchtune_ops
from executor.memory import measure_peak
from executor.traced.offload import HostPool
from graph_capture import capture


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64), nn.Dropout(0.1), nn.Linear(64, 8)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).square().mean()


def test_baseline_hooks_copy_exactly_and_count_host_bytes() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, inputs = _Net().train(), (torch.randn(16, 64),)
    eager = copy.deepcopy(model)
    eager_step = loss_step(eager, inputs)
    reference = step_gradients(eager, eager_step, seed=3)
    copied = {}
    for make in (SaveOnCpu, TorchtuneOffload):
        pool = HostPool()
        replica = copy.deepcopy(model)
        step, last = hooked_step(replica, inputs, lambda make=make, pool=pool: make(pool))
        grads = step_gradients(replica, step, seed=3)
        assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
        pool.reset_peak()
        measure_peak(step)
        assert pool.host_peak > 0 and last[0].d2h_bytes >= pool.host_peak
        assert pool.host_held == 0  # every host copy released by the step's end
        copied[make] = last[0].d2h_bytes
    # torchtune leaves tensors under 1 KiB (the (16, 8) output, 512 B) and parameters on the
    # device; save_on_cpu copies them all
    assert copied[TorchtuneOffload] < copied[SaveOnCpu]


def test_torchtune_ops_are_a_valid_schedule_that_offloads() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    captured = capture(_Net().train(), (torch.randn(16, 64),))
    keep_all = solver.solve(captured.dag, 1 << 62, time_limit=10)
    link = solver.Link(1e9, 1e9)
    ops = torchtune_ops(captured.dag, keep_all.ops)
    result = solver.simulate(captured.dag, ops, link)
    assert result.valid, result.error
    assert result.offloads > 0 and result.reloads > 0
    assert result.peak < keep_all.peak
    assert result.cost >= keep_all.cost
