"""Memory as the device counts it for one training step: what exists before the step, and the
measured peak of a whole step (forward, backward and the optimizer's step).

What exists before a step (`StaticBytes`), each counted once per storage: the parameters,
their `.grad` tensors, the optimizer's state (measured after one real step: AdamW's two moments,
SGD's momentum buffers), the buffers, and the inputs. The step then allocates its activations,
temporaries and incoming gradients (the byte budget `rematerialize` takes, docs/executor.md) and,
once the backward is done, the optimizer step's own temporaries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from executor.errors import FitError
from executor.memory import measure_peak
from solver.fitting.static import StaticBytes

OPTIMIZERS = ("adamw", "sgd", "none")
"""The optimizers a fit accounts for: AdamW (torch defaults), SGD with momentum 0.9, none."""
FSDP_OPTIMIZERS = {"adamw": "adamw", "sgd": "sgd_momentum", "none": "none"}
"""`OPTIMIZERS` as `solver.target.FsdpPolicy` names them."""


def make_optimizer(name: str, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer | None:
    """The optimizer `name` (one of `OPTIMIZERS`) over `params`; None for "none"."""
    if name == "adamw":
        return torch.optim.AdamW(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "none":
        return None
    raise FitError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {name!r}")


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view adds nothing)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


class TrainingStep:
    """One model, its inputs and its optimizer, ready to run whole training steps: after
    `prepare` (one real step, then `.grad` zeroed in place and kept) everything a step reads
    exists, so a step's measured peak is what it allocates above `static`."""

    def __init__(
        self,
        model: nn.Module,
        inputs: Sequence[torch.Tensor],
        kwargs: Mapping[str, torch.Tensor],
        optimizer: str,
        forward: Callable[..., object] | None = None,
    ) -> None:
        self.model, self.inputs, self.kwargs = model, tuple(inputs), dict(kwargs)
        self.forward = forward or model
        self.optimizer = make_optimizer(optimizer, model.parameters())

    def __call__(self) -> None:
        """Forward (to the loss: `forward` returns it, `executor.fitting.graphs.with_loss`),
        backward, the optimizer's step."""
        loss = self.forward(*self.inputs, **self.kwargs)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise FitError(
                "the step's loss (loss_fn of the model's output) must be a one-element "
                f"tensor, not {type(loss).__name__}: pass a loss_fn that returns the loss"
            )
        loss.backward()
        del loss
        if self.optimizer is not None:
            self.optimizer.step()

    def prepare(self) -> StaticBytes:
        """Run one step (gradients and optimizer state come into being), zero `.grad` in place
        and count what exists before the next step."""
        self()
        self.model.zero_grad(set_to_none=False)
        return self.static()

    def static(self) -> StaticBytes:
        params = list(self.model.parameters())
        state = [] if self.optimizer is None else list(self.optimizer.state.values())
        return StaticBytes(
            parameters=storage_bytes(params),
            gradients=storage_bytes(p.grad for p in params if p.grad is not None),
            optimizer_state=storage_bytes(
                v for s in state for v in s.values() if isinstance(v, torch.Tensor)
            ),
            buffers=storage_bytes(self.model.buffers()),
            inputs=storage_bytes([*self.inputs, *self.kwargs.values()]),
        )

    def measured_peak(self) -> int:
        """The whole step's measured peak in bytes: what exists before it plus the most it
        allocates above that (`executor.measure_peak`), the optimizer step included."""
        device = next(self.model.parameters()).device
        return self.static().total + measure_peak(self, device).peak_bytes

    def optimizer_temporaries(self) -> int:
        """Bytes the optimizer's step allocates above its start (0 without an optimizer), with
        `.grad` and the optimizer state in place."""
        if self.optimizer is None:
            return 0
        device = next(self.model.parameters()).device
        return measure_peak(self.optimizer.step, device).peak_bytes


OPTIMIZER_STATES = {"adamw": 2, "sgd": 1, "none": 0}
"""Per optimizer name, the state tensors it keeps per trainable parameter, each the
parameter's size: AdamW's two moments, SGD's momentum buffer."""


def predicted_static(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor],
    optimizer: str,
    rounding: int,
) -> tuple[StaticBytes, int]:
    """Estimate mode (no real step): what exists before a step and the optimizer step's
    temporaries, from shapes alone (a meta-built model works), each storage rounded up to a
    multiple of `rounding` (the target's allocator). The optimizer's state is AdamW's two
    moments or SGD's momentum buffer per trainable parameter; its step's temporaries are, for
    AdamW, one tensor per trainable parameter (the foreach step's square roots of the second
    moments), none for SGD. AdamW's per-parameter step counters (host scalars) are not counted."""

    def nbytes(tensors: Iterable[torch.Tensor]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            storage = t.untyped_storage()
            seen[id(t) if t.device.type == "meta" else storage.data_ptr()] = storage.nbytes()
        return sum(-(-b // rounding) * rounding for b in seen.values())

    params = list(dict.fromkeys(model.parameters()))
    trainable = nbytes(p for p in params if p.requires_grad)
    moments = OPTIMIZER_STATES[optimizer]
    static = StaticBytes(
        parameters=nbytes(params),
        gradients=trainable,
        optimizer_state=moments * trainable,
        buffers=nbytes(model.buffers()),
        inputs=nbytes([*inputs, *kwargs.values()]),
    )
    return static, trainable if optimizer == "adamw" else 0
