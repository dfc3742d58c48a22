"""HuggingFace models called the way training loops call them train bit-identically under a
schedule solved at 50%: GPT-2 and Llama causal LMs with ``labels=`` and their default configs
(``use_cache`` on: the output holds the key/value cache, the export lifted tensor constants),
BERT masked LM with ``attention_mask=``, ViT image classification and T5 encoder-decoder."""

from __future__ import annotations

import copy

import pytest
import torch

import solver
from executor.errors import InputMismatchError, UnusedOutputGradientError
from executor.memory import measure_peak
from executor.traced.module import Rematerialized, check_against_eager
from executor.traced.rematerialize import rematerialize
from graph_capture import CaptureError, capture
from graph_capture.models import hf_models
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
    captured = capture(remat_model, args, example_kwargs=kwargs, repeats=1)
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


def test_llama_with_grouped_query_attention_and_no_mask_trains_bit_identically():
    # called without a padding mask, eager HF runs SDPA with is_causal and enable_gqa; the
    # capture must trace that call, not export's explicit mask and repeated key/value heads,
    # whose gradients sum in another order (graph_capture/trace/hf_masks.py). 64 tokens: more
    # than one block of the CPU flash-attention backward, where the orders part
    torch.manual_seed(0)
    model, args, kwargs = hf_models.llama_lm(seq=64, layers=1, kv_heads=1)
    eager, remat_model = copy.deepcopy(model), copy.deepcopy(model)
    captured = capture(remat_model, args, example_kwargs=kwargs, repeats=1)
    everything = solver.checkpoint_all_peak(prepare(captured.dag))
    held = sum(captured.dag.graph["held_bytes"].values())
    for budget in (everything, held + (everything - held) // 2):
        schedule = solver.solve(captured.dag, budget=budget, time_limit=1)
        rm = Rematerialized(remat_model, captured, schedule)
        losses = []
        for module in (eager, rm):
            module.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            losses.append(module(*args, **kwargs).loss)
            losses[-1].backward()
        assert torch.equal(*losses)
        for (name, a), b in zip(eager.named_parameters(), remat_model.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), f"budget {budget}: {name}.grad differs"


def gqa_llama(call: str, layers: int = 2) -> tuple:
    """A Llama with grouped-query attention (2 query heads over 1 key/value head) on 64 tokens
    (more than one block of the CPU flash-attention backward, where the summation orders of
    enable_gqa and of repeated key/value heads part), called as ``call``: "use_cache=False"
    or "all-ones attention_mask"."""
    torch.manual_seed(0)
    model, args, kwargs = hf_models.llama_lm(seq=64, layers=layers, kv_heads=1)
    if call == "use_cache=False":
        model.config.use_cache = False
    else:
        kwargs = {"attention_mask": torch.ones_like(args[0]), **kwargs}
    return model, args, kwargs


@pytest.mark.parametrize("call", ["use_cache=False", "all-ones attention_mask"])
def test_llama_with_grouped_query_attention_where_eager_reads_the_inputs_trains_bit_identically(
    call,
):
    # eager HF reads the position ids (use_cache=False: are sequences packed?) or the padding
    # mask (all ones) and then drops the mask for SDPA's is_causal and enable_gqa; the capture
    # takes that decision on the example's values (graph_capture/trace/hf_masks.py): the
    # position ids come from arange (no guard), the mask is an input (guarded at each step)
    model, args, kwargs = gqa_llama(call)
    options = {"repeats": 1}
    kept = rematerialize(
        copy.deepcopy(model), args, "100%", example_kwargs=kwargs, capture_options=options
    )
    captured = kept.captured
    reads = [guard.reads for guard in captured.mask_guards]
    assert reads == ([] if call == "use_cache=False" else [("attention_mask",)])
    everything = solver.checkpoint_all_peak(prepare(captured.dag))
    held = sum(captured.dag.graph["held_bytes"].values())
    # a quarter of the way from what the executor holds to keeping everything: schedules there
    # recompute; any schedule found in the time is exact, so the solve's limit is no condition
    schedule = solver.solve(captured.dag, budget=held + (everything - held) // 4, time_limit=2)
    assert len(schedule.ops) > 2 * captured.dag.number_of_nodes(), "no recomputation"
    tight = Rematerialized(copy.deepcopy(model), captured, schedule)
    assert check_against_eager(tight, args, kwargs).worst == 0.0  # rematerialize's check
    for rm in (kept, tight):
        eager = copy.deepcopy(model)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, rm)]
        for step in range(2):
            losses = []
            for module, optimizer in zip((eager, rm), optimizers, strict=True):
                optimizer.zero_grad(set_to_none=True)
                torch.manual_seed(step)
                losses.append(module(*args, **kwargs).loss)
                losses[-1].backward()
            assert torch.equal(*losses), f"step {step}: loss differs"
            for (name, a), b in zip(eager.named_parameters(), rm.parameters(), strict=True):
                assert torch.equal(a.grad, b.grad), f"step {step}: {name}.grad differs"
            for optimizer in optimizers:
                optimizer.step()


def test_a_step_whose_mask_makes_eager_take_the_other_branch_is_refused():
    # captured on an all-ones mask, the graph leaves the causal mask out as eager does there;
    # a step whose mask pads would have eager build it, and one captured with padding builds
    # it where eager leaves it out without: each is refused in one line, never run the other way
    model, args, ones = gqa_llama("all-ones attention_mask", layers=1)
    mask = ones["attention_mask"].clone()
    mask[0, -3:] = 0
    padded = {**ones, "attention_mask": mask}
    builds = r"builds the causal mask \(a padded token\)"
    leaves = r"leaves the causal mask out \(no padded token: SDPA with is_causal\)"
    for example, step, now, then in (
        (ones, padded, builds, leaves),
        (padded, ones, leaves, builds),
    ):
        captured = capture(copy.deepcopy(model), args, example_kwargs=example, repeats=1)
        rm = Rematerialized(copy.deepcopy(model), captured, solver.solve(captured.dag))
        rm(*args, **example).loss.backward()
        refused = (
            rf"^keyword input 'attention_mask': on this step's values eager transformers {now}, "
            rf"but the graph was captured on values where it {then} and computes only that way; "
            r"capture \(rematerialize\) with example inputs like this step's$"
        )
        with pytest.raises(InputMismatchError, match=refused):
            rm(*args, **step)


def test_keyword_inputs_may_come_in_any_order_and_are_checked_by_name():
    torch.manual_seed(0)
    model, args, kwargs = hf_models.bert_mlm(layers=1)
    rm = rematerialize(  # a budget every schedule fits: the test is of the call, not the solve
        model, args, "1GiB", example_kwargs=kwargs, capture_options={"repeats": 1}, time_limit=20
    )
    reordered = dict(reversed(list(kwargs.items())))
    torch.manual_seed(1)
    first = rm(*args, **kwargs).loss
    torch.manual_seed(1)
    assert torch.equal(rm(*args, **reordered).loss, first)
    with pytest.raises(InputMismatchError, match=r"expected keyword inputs \['attention_mask'"):
        rm(*args, labels=kwargs["labels"])


def test_outputs_the_loss_does_not_use_cost_no_tangent_and_train_bit_identically():
    # backward_from=["loss"]: the logits' and the key/value cache's zero gradients are known at
    # capture, their adds folded (into the value itself, or a contiguous copy of a transposed
    # one), so the step holds no tangent but the loss's and a few one-element zeros, and both
    # executor paths still train exactly like eager
    torch.manual_seed(0)
    model, args, kwargs = hf_models.gpt2_lm()
    before = capture(copy.deepcopy(model), args, example_kwargs=kwargs, repeats=1)
    captured = capture(
        copy.deepcopy(model), args, example_kwargs=kwargs, repeats=1, backward_from=["loss"]
    )
    assert before.dag.graph["held_bytes"]["tangents"] > 30_000
    assert captured.dag.graph["held_bytes"]["tangents"] <= 4 * len(captured.tangent_placeholders)
    assert captured.dag.number_of_nodes() < before.dag.number_of_nodes()  # the adds are gone
    schedule = solver.solve(captured.dag, budget="70%", time_limit=1)
    eager = copy.deepcopy(model)
    remats = [
        Rematerialized(copy.deepcopy(model), captured, schedule, compiled=compiled)
        for compiled in (True, False)
    ]
    modules = [eager, *remats]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in modules]
    for step in range(3):
        seen = []
        for module, optimizer in zip(modules, optimizers, strict=True):
            torch.manual_seed(10 + step)
            out = module(*args, **kwargs)
            out.loss.backward()
            seen.append([out.loss, out.logits, *(p.grad.clone() for p in module.parameters())])
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        for other in seen[1:]:
            assert all(torch.equal(a, b) for a, b in zip(seen[0], other, strict=True)), step
    for remat in remats:
        step_of = lambda remat=remat: remat(*args, **kwargs).loss.backward()  # noqa: E731
        step_of()
        measured = measure_peak(step_of).peak_bytes
        assert measured <= schedule.budget
        assert measured <= schedule.peak


def test_a_gradient_into_an_output_captured_as_unused_is_refused():
    torch.manual_seed(0)
    model, args, kwargs = hf_models.vit_classifier(layers=1)
    rm = rematerialize(  # a budget every schedule fits: the test is of the call, not the solve
        model,
        args,
        "1GiB",
        example_kwargs=kwargs,
        capture_options={"repeats": 1, "backward_from": ["loss"]},
        time_limit=20,
    )
    out = rm(*args, **kwargs)
    torch.autograd.backward([out.loss, out.logits], [None, torch.zeros_like(out.logits)])
    out = rm(*args, **kwargs)
    with pytest.raises(UnusedOutputGradientError, match="backward_from naming it"):
        (out.loss + out.logits.sum()).backward()
    with pytest.raises(CaptureError, match=r"not outputs of the model; its outputs are \['loss'"):
        capture(model, args, example_kwargs=kwargs, repeats=1, backward_from=["los"])
