"""A SAC plan under torch.compile (inductor, CPU): gradients allclose to the compiled model
without the plan (inductor is not bit-identical to eager, FIELD-NOTES), and the measured peak
of both reported beside the plan's budget (the partitioner honours MUST_SAVE/MUST_RECOMPUTE,
but inductor's fusions change what a step allocates, so the eager model's prediction is not
asserted there). Under compile the policy finds the plan's saved ops by op and occurrence, as
SAC's own cache does (NOTE [ SAC plans under compile ] in executor/sac.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from sac_models import every_saveable, replanned, sum_loss, transformer

import executor

pytestmark = pytest.mark.usefixtures("one_thread")


def test_compiled_plan_matches_compiled_model(record_property):
    net = transformer(layers=2, d=16)
    x = torch.randn(2, 8, 16)
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=10, loss_fn=sum_loss)
    assert plan.checkpointed_regions()
    plan, _ = replanned(plan, every_saveable(plan))  # its regions under SAC policies
    assert any(plan.saved)
    torch._dynamo.reset()
    runs = [torch.compile(copy.deepcopy(net)), torch.compile(plan.apply(copy.deepcopy(net)))]
    grads, peaks = [], []
    for model in runs:
        torch.manual_seed(0)
        model(x).sum().backward()
        grads.append([p.grad for p in model.parameters()])
        model.zero_grad(set_to_none=True)
        peaks.append(executor.measure_peak(lambda m=model: m(x).sum().backward()).peak_bytes)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
    record_property("compiled_peak_bytes", peaks[0])
    record_property("compiled_plan_peak_bytes", peaks[1])
    record_property("plan_budget_bytes", plan.budget)
    print(f"compiled: {peaks[0]} B; compiled with the plan: {peaks[1]} B; budget {plan.budget} B")
