"""HuggingFace models called the way training loops call them train bit-identically under a
schedule solved at 50%: GPT-2 and Llama causal LMs with ``labels=`` and their default configs
(``use_cache`` on: the output holds the key/value cache, the export lifted tensor constants),
BERT masked LM with ``attention_mask=``, ViT image classification and T5 encoder-decoder."""

from __future__ import annotations

import copy

import pytest
import torch

import solver
from executor.errors import InputMismatchError
from executor.module import Rematerialized, rematerialize
from graph_capture import capture, hf_models
from solver import prepare

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ["gpt2_lm", "llama_lm", "bert_mlm", "vit_classifier", "t5_lm"]


def to_device(call: tuple, device: str) -> tuple:
    model, args, kwargs = call
    return (
        model.to(device),
        tuple(x.to(device) for x in args),
        {k: v.to(device) for k, v in kwargs.items()},
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_training_call_is_bit_identical_at_half_the_checkpoint_all_peak(family, device):
    torch.manual_seed(0)
    model, args, kwargs = to_device(getattr(hf_models, family)(), device)
    eager, remat_model = copy.deepcopy(model), copy.deepcopy(model)
    captured = capture(remat_model, args, kwargs, repeats=1)
    assert captured.kwarg_names == tuple(kwargs)
    # half of the checkpoint-all peak above what the executor holds whatever the schedule
    # (held_bytes: the logits the caller keeps and their tangent are most of it here)
    held = sum(captured.dag.graph["held_bytes"].values())
    budget = held + (solver.checkpoint_all_peak(prepare(captured.dag)) - held) // 2
    schedule = solver.solve(captured.dag, budget=budget, time_limit=1)
    assert schedule.peak <= budget
    assert len(schedule.ops) > 2 * captured.dag.number_of_nodes(), "no recomputation at 50%"
    rm = Rematerialized(remat_model, captured, schedule)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, rm)]
    for step in range(3):
        outputs = []
        for module, optimizer in zip((eager, rm), optimizers, strict=True):
            torch.manual_seed(10 + step)
            out = module(*args, **kwargs)
            out.loss.backward()
            outputs.append(out)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        want, got = outputs
        assert type(got) is type(want) and list(got.keys()) == list(want.keys())
        assert torch.equal(got.loss, want.loss), f"step {step}: loss differs"
        assert torch.equal(got.logits, want.logits), f"step {step}: logits differ"
        for (name, a), b in zip(eager.named_parameters(), remat_model.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: {name} differs after the update"


def test_keyword_inputs_may_come_in_any_order_and_are_checked_by_name():
    torch.manual_seed(0)
    model, args, kwargs = hf_models.bert_mlm(layers=1)
    rm = rematerialize(
        model, args, "100%", example_kwargs=kwargs, capture_options={"repeats": 1}, time_limit=1
    )
    reordered = dict(reversed(list(kwargs.items())))
    torch.manual_seed(1)
    first = rm(*args, **kwargs).loss
    torch.manual_seed(1)
    assert torch.equal(rm(*args, **reordered).loss, first)
    with pytest.raises(InputMismatchError, match=r"expected keyword inputs \['attention_mask'"):
        rm(*args, labels=kwargs["labels"])
