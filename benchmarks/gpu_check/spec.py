"""What a run is made of: the runtimes, the time limits, the models (`ModelSpec`, `MODELS`),
a result (`Cell`) and one model on one device (`Run`: its reference step, gradient check and
measurement)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from benchmarks.running.breadth_steps import first_difference
from benchmarks.zoo import Bench, gpt2, llama, resnet50

SEED = 1234
RUNTIMES = (
    "eager",
    "remat",
    "remat+offload",
    "sac",
    "sac+offload",
    "compile",
    "compile+offload",
)
QUICK_LINK_BYTES = 16 << 20
"""Bytes per timed host-link copy with ``--quick`` (small shapes: their values are KiB)."""
LIMITS = {
    "setup": 20.0,
    "capture": 30.0,
    "eager": 10.0,
    "remat": 15.0,
    "remat+offload": 25.0,
    "sac": 25.0,
    "sac+offload": 15.0,
    "compile": 30.0,
    "compile+offload": 15.0,
}
"""Seconds per phase of a model: ``setup`` (the subprocess's imports, the model, the reference
step), ``capture``, then each cell; `--limit-scale` multiplies them all."""


@dataclass(frozen=True)
class ModelSpec:
    """A model at its GPU shape and its CPU ``--quick`` shape (each a `Bench` factory)."""

    full: Callable[[], Bench]
    quick: Callable[[], Bench]
    description: str


MODELS: dict[str, ModelSpec] = {
    "gpt2": ModelSpec(
        lambda: gpt2(layers=12, hidden=768, heads=12, batch=4, seq=1024, vocab=50257),
        lambda: gpt2(layers=2, hidden=64, heads=2, batch=2, seq=32, vocab=256),
        "GPT2LMHeadModel, 12 layers, width 768, vocabulary 50257, batch 4 x 1024 (124M "
        "parameters); --quick: 2 layers, width 64, batch 2 x 32",
    ),
    "llama": ModelSpec(
        lambda: llama(layers=4, hidden=1024, heads=16, kv_heads=4, batch=1, seq=4096, vocab=32000),
        lambda: llama(layers=2, hidden=64, heads=2, kv_heads=1, batch=1, seq=64, vocab=256),
        "LlamaForCausalLM, 4 decoder layers, width 1024, 16 heads (4 KV), vocabulary 32000, "
        "batch 1 x 4096; --quick: 2 layers, width 64, batch 1 x 64",
    ),
    "resnet50": ModelSpec(
        lambda: resnet50(batch=32, image=224, classes=1000),
        lambda: resnet50(batch=2, image=32, width=8),
        "ResNet-50 (torchvision's layout), batch 32 of 224x224, 1000 classes; --quick: batch 2 "
        "of 32x32, width 8",
    ),
}


@dataclass
class Cell:
    """One runtime on one model. Bytes, seconds; None where not measured or not predicted.
    ``result``: ``ok``, ``WRONG: ...`` or ``refused: ...``; ``grads``: ``bit-equal``,
    ``allclose`` or what differs; ``copies``: the own executor's offload ops, SAC's offloaded
    ops and parked regions."""

    model: str
    runtime: str
    result: str = ""
    budget: int | None = None
    status: str | None = None
    predicted_peak: int | None = None
    measured_peak: int | None = None
    predicted_s: float | None = None
    measured_s: float | None = None
    grads: str | None = None
    host_predicted: int | None = None
    host_measured: int | None = None
    copies: str | None = None
    seconds: float = 0.0


@dataclass
class Run:
    """One model on one device: the pristine model (CPU), its inputs on the device, the
    reference step, the link, and what the cells share (the capture, budgets)."""

    name: str
    bench: Bench
    device: torch.device
    link_name: str
    target: str | None
    backend: str
    steps: int
    scale: float
    inputs: tuple[torch.Tensor, ...] = ()
    reference: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)

    def limit(self, phase: str) -> float:
        return LIMITS[phase] * self.scale

    def fresh(self) -> nn.Module:
        """A copy of the pristine model on the device."""
        return copy.deepcopy(self.bench.model).to(self.device)

    def step(self, module: Callable) -> torch.Tensor:
        """One training step of `module` from the seed: the loss, after its backward."""
        torch.manual_seed(SEED)
        loss = module(*self.inputs)
        loss.backward()
        return loss

    def state(self, model: nn.Module, loss: torch.Tensor) -> dict:
        """The loss, every `.grad` and every buffer, cloned."""
        out = {"loss": loss.detach().clone()}
        for name, p in model.named_parameters():
            out[f".grad of {name}"] = None if p.grad is None else p.grad.clone()
        out |= {f"buffer {name}": b.clone() for name, b in model.named_buffers()}
        return out

    def check(self, module: Callable, model: nn.Module, exact: bool) -> str:
        """The step of `module` (training `model`) from `.grad` None against the reference:
        ``bit-equal``/``allclose``; `Mismatch` where a tensor differs."""
        model.zero_grad(set_to_none=True)
        got = self.state(model, self.step(module))
        model.zero_grad(set_to_none=True)
        if exact:
            difference = first_difference(self.reference, got)
            if difference:
                raise Mismatch(difference)
            return "bit-equal"
        for key, want in self.reference.items():
            have = got.get(key)
            if (want is None) != (have is None) or (
                want is not None and not torch.allclose(want, have, rtol=1e-3, atol=1e-5)
            ):
                raise Mismatch(f"{key} not allclose (rtol 1e-3, atol 1e-5)")
        return "allclose"

    def synchronized(self, module: Callable) -> Callable[[], None]:
        def run() -> None:
            self.step(module)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return run

    def measure(self, cell: Cell, module: Callable, model: nn.Module, grads_before: bool) -> None:
        """The measured peak of one step (`.grad` allocated before it where `grads_before`, as
        the own executor states its budget, else None) and the median step seconds."""
        from executor import measure_peak, median_seconds

        model.zero_grad(set_to_none=True)
        if grads_before:
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        with torch.random.fork_rng(devices=_rng_devices(self.device)):
            cell.measured_peak = measure_peak(self.synchronized(module), self.device).peak_bytes
            cell.measured_s = median_seconds(self.synchronized(module), self.steps, warmup=1)
        model.zero_grad(set_to_none=True)


class Mismatch(Exception):
    """The runtime's step differs from the reference."""


def _rng_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def model_budget(scale: float) -> float:
    """The most seconds one model's subprocess may take: its phases' limits."""
    return sum(LIMITS.values()) * scale


def compile_backend(device: str) -> str:
    """The compile cell's backend: inductor on CUDA; aot_eager on the CPU, where inductor
    compiles for tens of seconds per model (FIELD-NOTES) and the check is bit for bit."""
    return "inductor" if device == "cuda" else "aot_eager"
