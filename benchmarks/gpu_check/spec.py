"""What a run is made of: the runtimes, the deterministic settings, the time limits, the models
(`ModelSpec`, `MODELS`), a result (`Cell`) and one model on one device (`Run`: its reference
step, eager's repeat, the gradient check and measurement)."""

from __future__ import annotations

import copy
import math
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
OFFLOADING = ("remat+offload", "sac+offload", "compile+offload")
QUICK_LINK_BYTES = 16 << 20
"""Bytes per timed host-link copy with ``--quick`` (small shapes: their values are KiB)."""

DETERMINISM_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""Set in each model's subprocess environment, so that it holds before torch is imported
(cuBLAS reads it when CUDA initialises)."""
DETERMINISM = (
    "torch.use_deterministic_algorithms(True)",
    *(f"{k}={v}" for k, v in DETERMINISM_ENV.items()),
    "torch.backends.cudnn.deterministic=True",
    "torch.backends.cudnn.benchmark=False",
)
"""The settings every model's process runs under (`deterministic`), as the header names them."""


def deterministic() -> None:
    """The torch settings of `DETERMINISM` (the environment's are `DETERMINISM_ENV`)."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


LIMITS = {
    "start": 15.0,
    "setup": 25.0,
    "capture": 35.0,
    "eager": 10.0,
    "remat": 20.0,
    "remat+offload": 25.0,
    "sac": 25.0,
    "sac+offload": 20.0,
    "compile": 90.0,
    "compile+offload": 90.0,
}
"""Seconds per phase of a model: ``start`` (the subprocess's imports), ``setup`` (the model,
its reference step and eager's repeat), ``capture``, then
each cell; `--limit-scale` multiplies them all. The compile cells (inductor on CUDA): at most
two compiles (remat's partition, and torch's own partition that the check holds it against;
a third where the first measures over the budget, as time allows), at about 40 s each for
the 4-layer GPT-2: 60-120 s per inductor compile of a 12-layer GPT-2's forward and backward
on an H100 host, a third of it for a third of the layers (dynamo traces every layer, and
AOTAutograd's partition and inductor's lowering handle every node; identical layers' kernels
compile once)."""
COMPILE_PHASES = ("compile", "compile+offload")
RUN_LIMITS = {"link": 15.0, "structure": 40.0}
"""Seconds of the run's own steps: measuring the host link, and ``structure``: the CUDA-only
tests on the device (`STRUCTURE_TESTS`)."""
STRUCTURE_TESTS = "cuda and not long"
"""The structure step's ``pytest -m`` expression: the CUDA-only tests but the long ones (the
inductor compiles of `tests/test_compile_offload.py`'s CUDA test take minutes, more than the
step's limit; the compile cells run that path on CUDA)."""


@dataclass(frozen=True)
class ModelSpec:
    """A model at its GPU shape and its CPU ``--quick`` shape (`Bench` factories)."""

    full: Callable[[], Bench]
    quick: Callable[[], Bench]
    description: str

    def bench(self, quick: bool) -> Bench:
        return (self.quick if quick else self.full)()


MODELS: dict[str, ModelSpec] = {
    "gpt2": ModelSpec(
        lambda: gpt2(layers=4, hidden=768, heads=12, batch=4, seq=1024, vocab=50257),
        lambda: gpt2(layers=2, hidden=64, heads=2, batch=2, seq=32, vocab=256),
        "GPT2LMHeadModel, 4 layers (inductor compiles fit the run's 10 minutes), width 768, "
        "vocabulary 50257, batch 4 x 1024; --quick: 2 layers, width 64, batch 2 x 32",
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
DEFAULT_MODELS = ("gpt2", "resnet50")
"""What a run without ``--models`` runs: a transformer and a CNN (Llama on request: three
models' limits are more than the 10 minutes)."""
DEFAULT_COMPILE_MODELS = ("gpt2",)
"""The models whose compile cells run without ``--compile-models``: two inductor cells of one
model fit the 10 minutes."""


@dataclass
class Cell:
    """One runtime on one model. Bytes, seconds; None where not measured or not predicted.
    ``result``: ``ok``, ``WRONG: ...`` (eager repeats itself and the runtime differs),
    ``UNSURE: ...`` (eager does not repeat itself, and the runtime differs beyond eager's own
    spread), ``no copy: ...`` (an offload cell whose plan moves nothing: not an offload
    check), ``skipped: ...`` or ``refused: ...`` (the cell could not run: why, in one line);
    ``grads``: ``bit-equal``, ``allclose``, within eager's spread, or (eager's row) whether
    eager repeats itself; ``copies``: the copies the plan moves to the host (the own
    executor's and compile's offload ops; SAC's offloaded ops and parked regions), ``moved``
    what they are."""

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
    predicted_host_peak: int | None = None
    measured_host_peak: int | None = None
    copies: int | None = None
    moved: str | None = None
    seconds: float = 0.0


@dataclass
class Run:
    """One model on one device: the pristine model (CPU), its inputs on the device, the
    reference step and eager's repeat of it, the link, and what the cells share (the capture,
    budgets). ``compiles``: whether its compile cells run."""

    name: str
    bench: Bench
    device: torch.device
    link_name: str
    backend: str
    steps: int
    scale: float
    compiles: bool = True
    inputs: tuple[torch.Tensor, ...] = ()
    reference: dict = field(default_factory=dict)
    repeats: str | None = None
    spread: dict = field(default_factory=dict)
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

    def reference_and_repeat(self) -> None:
        """The inputs on the device, the reference step (eager, from `.grad` None) and a second
        one from a fresh copy: `repeats` is None where the two are equal bit for bit, else
        what differs, and `spread` per tensor the most the two differ by."""
        self.inputs = tuple(t.to(self.device) for t in self.bench.inputs)
        states = []
        for _ in range(2):
            model = self.fresh()
            with torch.random.fork_rng(devices=_rng_devices(self.device)):
                states.append(self.state(model, self.step(model)))
        self.reference, again = states
        self.repeats = first_difference(self.reference, again)
        self.spread = {k: _distance(v, again.get(k)) for k, v in self.reference.items()}

    def check(self, module: Callable, model: nn.Module, exact: bool) -> str:
        """The step of `module` (training `model`) from `.grad` None against the reference:
        ``bit-equal``/``allclose``; where eager does not repeat itself, within eager's own
        spread (`Unsure` beyond it); `Mismatch` where a tensor differs and eager repeats."""
        model.zero_grad(set_to_none=True)
        got = self.state(model, self.step(module))
        model.zero_grad(set_to_none=True)
        if exact:
            difference = first_difference(self.reference, got)
            if difference is None:
                return "bit-equal"
            if self.repeats is None:
                raise Mismatch(difference)
            for key, want in self.reference.items():
                distance = _distance(want, got.get(key))
                if distance > self.spread[key]:
                    raise Unsure(
                        f"{key} differs by {distance:.3g}, beyond eager's own spread "
                        f"{self.spread[key]:.3g} (eager does not repeat itself: {self.repeats})"
                    )
            return f"within eager's spread ({difference})"
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
    """The runtime's step differs from the reference, and eager repeats itself."""


class Unsure(Exception):
    """The runtime's step differs from the reference beyond eager's own spread, and eager does
    not repeat itself."""


class NoCopy(Exception):
    """An offload cell's plan moves nothing to the host: not an offload check."""


def _distance(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """The most two tensors differ by (0 for two None; inf where one is None, or the shapes
    or dtypes differ, or a NaN differs)."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    if a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    if a.numel() == 0:
        return 0.0
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    difference = (a.double() - b.double()).abs()
    if bool((a.isnan() != b.isnan()).any()):
        return math.inf
    return float(difference.nan_to_num(0.0).max())


def _rng_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def model_budget(scale: float, compiles: bool) -> float:
    """The most seconds one model's subprocess may take: its phases' limits (the compile
    cells' where they run)."""
    phases = [p for p in LIMITS if compiles or p not in COMPILE_PHASES]
    return sum(LIMITS[p] for p in phases) * scale


def run_budget(scale: float, models: list[str], compile_models: list[str]) -> float:
    """The most seconds the run may take: the link, the structure step and every model."""
    most = sum(RUN_LIMITS.values()) * scale
    return most + sum(model_budget(scale, m in compile_models) for m in models)


def compile_backend(device: str) -> str:
    """The compile cell's backend: inductor on CUDA; aot_eager on the CPU, where inductor
    compiles for tens of seconds per model (FIELD-NOTES) and the check is bit for bit."""
    return "inductor" if device == "cuda" else "aot_eager"
