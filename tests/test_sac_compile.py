"""SAC plans under torch.compile (inductor, CPU): the compiled forward saves for backward what
the plan says, and gradients are allclose to the compiled model without a plan (inductor is not
bit-identical to eager, FIELD-NOTES).

What the compiled forward saves is counted by `saved_tensors_hooks` around the compiled call
(bytes, storage-deduplicated, parameters and inputs excluded): a plan that checkpoints a region
with no saving ops leaves the partitioner only that region's inputs to save there (MUST_RECOMPUTE
everywhere inside), so it saves fewer bytes than the plain compiled model and than the same
regions with every saveable op MUST_SAVE. The plan's peak is measured and asserted below the
plain compiled model's; the eager model's predicted bytes are not asserted (inductor's fusions
change what a step allocates). Under compile the policy finds the plan's saved ops by op and
occurrence, as SAC's own cache does (NOTE [ SAC plans under compile ] in
executor/sac/runtime/planned_forward.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from sac_models import every_saveable, replanned, sum_loss, transformer
from saved_bytes import eager_saved_bytes

import executor

pytestmark = pytest.mark.usefixtures("one_thread")


def test_compiled_plan_saves_and_peaks_as_planned(record_property):
    net = transformer(layers=2, d=16)
    x = torch.randn(2, 8, 16)
    solved = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss)
    assert solved.checkpointed_regions()
    # its regions saving nothing: at the least peak, saving an op or recomputing it can tie in
    # bytes, and the measured seconds that break the tie move with the load
    plan, _ = replanned(solved, tuple(frozenset() for _ in solved.saved))
    assert plan.checkpointed_regions() == solved.checkpointed_regions() and not any(plan.saved)
    saving, _ = replanned(plan, every_saveable(plan))  # the same regions under SAC policies
    assert any(saving.saved)
    torch._dynamo.reset()
    models = {"plain": net, "plan": plan.apply(copy.deepcopy(net))}
    models["saving"] = saving.apply(copy.deepcopy(net))
    grads, saved, peaks = {}, {}, {}
    for name, model in models.items():
        compiled = torch.compile(model)
        torch.manual_seed(0)
        compiled(x).sum().backward()
        grads[name] = [p.grad for p in compiled.parameters()]
        compiled.zero_grad(set_to_none=True)
        saved[name] = eager_saved_bytes(compiled, (x,))
        peaks[name] = executor.measure_peak(lambda m=compiled: m(x).sum().backward()).peak_bytes
        record_property(f"compiled_{name}_saved_bytes", saved[name])
        record_property(f"compiled_{name}_peak_bytes", peaks[name])
    print(f"compiled, saved for backward: {saved} B; peak: {peaks} B; budget {plan.budget} B")
    for name in ("plan", "saving"):
        for a, b in zip(grads["plain"], grads[name], strict=True):
            torch.testing.assert_close(a, b)
    assert saved["plan"] < saved["plain"], "the compiled forward ignored the checkpointed region"
    assert saved["plan"] < saved["saving"], "the compiled forward ignored the MUST_SAVE ops"
    assert peaks["plan"] < peaks["plain"]
