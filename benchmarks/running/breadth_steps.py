"""What every breadth cell is built from: one seeded training step (`train_step`), the
forwards without gradients (`EVALUATIONS`), the bit-for-bit comparison (`same_bits`,
`first_difference`) and the measured peak of one more step (`measured_peak`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from benchmarks.running.breadth_models import Case

SEED = 1234
LR = 0.01


def train_step(module: Callable, model: nn.Module, case: Case, opt, step: int) -> dict:
    """One step of `module` (training `model`'s parameters) from the step's seed; returns the
    loss, every `.grad`, every buffer after the step and every parameter after the update."""
    torch.manual_seed(SEED + step)
    loss = case.loss_fn(module(*case.inputs, **case.kwargs))
    loss.backward()
    state = {"loss": loss.detach().clone()}
    for name, p in model.named_parameters():
        state[f".grad of {name}"] = None if p.grad is None else p.grad.clone()
    for name, b in model.named_buffers():
        state[f"buffer {name}"] = b.clone()
    opt.step()
    for name, p in model.named_parameters():
        state[f"{name} after the SGD step"] = p.detach().clone()
    opt.zero_grad(set_to_none=False)
    return state


EVALUATIONS = ("no_grad", "inference_mode")
"""After the training steps, one forward without gradients each way: under `torch.no_grad` in
training mode (dropout and BatchNorm statistics as in training) and under
`torch.inference_mode` in eval mode (an evaluation loop)."""


def evaluate(module: Callable, model: nn.Module, case: Case, mode: str) -> dict:
    """The loss of one forward of `module` under `mode` (`EVALUATIONS`) from the seed, and
    every buffer after it; `model` is left in training mode."""
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    for m in {id(module): module, id(model): model}.values():
        if isinstance(m, nn.Module):
            m.train(mode == "no_grad")
    try:
        torch.manual_seed(SEED - 1)
        with context:
            state = {"loss": case.loss_fn(module(*case.inputs, **case.kwargs)).clone()}
            state |= {f"buffer {name}": b.clone() for name, b in model.named_buffers()}
    finally:
        for m in (module, model):
            if isinstance(m, nn.Module):
                m.train(True)
    return state


def same_bits(a: object, b: object) -> bool:
    """`a` and `b` are both None, or tensors of one dtype and shape holding the same bits
    (floating point compared as integers of its width: NaNs compare, and -0.0 is not 0.0)."""
    if a is None or b is None:
        return a is None and b is None
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def first_difference(want: dict, got: dict) -> str | None:
    """The first tensor of `want` that `got` does not hold bit for bit, with how many more
    differ; None when all are equal."""
    differ = []
    for key, a in want.items():
        if not same_bits(a, got.get(key, "missing")):
            differ.append(key)
    differ += [key for key in got if key not in want]
    if not differ:
        return None
    more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
    return f"{differ[0]} differs{more}"


def measured_peak(module: Callable, model: nn.Module, case: Case, runtime: str) -> int:
    """The measured peak (bytes above the step's start) of one step of `module`, `.grad`
    allocated before it for the own executor and set to None otherwise; RNG restored after."""
    from executor import measure_peak

    model.zero_grad(set_to_none=runtime != "remat")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return measure_peak(
            lambda: case.loss_fn(module(*case.inputs, **case.kwargs)).backward()
        ).peak_bytes
