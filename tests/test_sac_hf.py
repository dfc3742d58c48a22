"""SAC plans on HuggingFace models (transformers 5.x, small configs), applied with remat's own
wrapping (`plan.apply`): the default blocks are the `GradientCheckpointingLayer`s, the regions
those or their children (whichever space's optimum costs less); gradients
over 3 AdamW steps (GPT-2 with its dropout on) are `torch.equal` to the model without
checkpointing, and the measured peak is within the budget and the prediction.

Why not `activation_checkpointing_enable(activation_checkpointing_kwargs={"context_fn": ...})`:
HF passes that one `context_fn` to every layer, while an exact plan's policy differs per block
(which ops are saved, where its op stream is checked)."""

from __future__ import annotations

import copy

import pytest
import torch
from sac_models import assert_same_adamw_steps

import executor

pytest.importorskip("transformers")
from graph_capture.models.hf_models import gpt2_lm, llama_lm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("make", [gpt2_lm, llama_lm])
def test_hf_plan_is_exact_and_within_budget(make):
    torch.manual_seed(0)
    model, args, kwargs = make(batch=2, seq=16, layers=3, width=32)
    kwargs["use_cache"] = False
    plan = executor.checkpoint_plan(model, args, "min", example_kwargs=kwargs, time_limit=60)
    layers = [n for n, m in model.named_modules() if type(m).__name__.endswith(("Block", "Layer"))]
    assert len(layers) == 3 and all(b.startswith(tuple(layers)) for b in plan.regions)
    assert plan.checkpointed_regions()
    runs = [copy.deepcopy(model), plan.apply(copy.deepcopy(model))]

    def step(m):
        m(*args, **kwargs).loss.backward()

    step(runs[1])
    runs[1].zero_grad(set_to_none=True)
    measured = executor.measure_peak(lambda: step(runs[1])).peak_bytes
    assert measured <= plan.budget and measured <= 1.03 * plan.peak
    assert_same_adamw_steps(runs, lambda m, _: m(*args, **kwargs).loss)
