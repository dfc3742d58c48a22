"""Faster CPU implementations of aten ops, bit-identical to the kernels they stand for.

The CPU kernels of ``native_dropout`` and ``native_dropout_backward`` multiply a float tensor
by a bool mask (``input.mul(mask).mul_(scale)``, ``grad * mask * scale``). Type promotion first
converts the mask to the float dtype, and the bool-to-float conversion is not vectorised: on a
(4, 65, 256) float32 tensor on one thread it takes about 115 us, where the same bytes read as
uint8 convert in about 17 us. The implementations here make the same calls on the mask viewed
as uint8 (same size, same layout, values 0 and 1), so the products, and every bit of the
results, are the same: the conversion gives 0.0 and 1.0 either way and the multiplications are
the kernel's own. The draws are the kernel's too: the mask is allocated as the kernel allocates
it and filled by the same ``bernoulli_`` call, so the generator advances exactly as it would.
On a captured ViT with 12 layers (37 dropouts) the conversions took about 9 ms of a 336 ms
step (`torch.profiler`), and with these implementations the step is about 7.6 ms shorter
(docs/benchmarks.md, "Real models at equal measured memory").

Capture times the ops it measures with these implementations (`graph_capture.measurement.measure`)
and the executor's generated code calls them (`executor.traced.codegen`), so the node costs are
those of what runs. Only nodes on the CPU use them (`implementation`); every input a kernel treats
in another way (an empty tensor, evaluation mode, a mask that is not bool) goes to the aten op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from graph_capture.trace.fx_nodes import device_of

__all__ = ["FAST_CPU", "implementation"]

aten = torch.ops.aten


def native_dropout(
    input: torch.Tensor, p: float, train: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.native_dropout`` on the CPU, as its kernel computes it: (output, bool mask)."""
    if input.numel() == 0 or train is False:
        return aten.native_dropout.default(input, p, train)
    p1m = 1.0 - p
    scale = 0.0 if p1m == 0 else 1.0 / p1m
    mask = torch.empty_like(input, dtype=torch.bool)
    mask.bernoulli_(p1m)
    return torch.mul(input, mask.view(torch.uint8)).mul_(scale), mask


def native_dropout_backward(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``aten.native_dropout_backward`` on the CPU as its kernel computes it: grad*mask*scale."""
    if mask.dtype != torch.bool:
        return aten.native_dropout_backward.default(grad, mask, scale)
    return torch.mul(grad, mask.view(torch.uint8)).mul_(scale)


FAST_CPU: dict[object, Callable[..., object]] = {
    aten.native_dropout.default: native_dropout,
    aten.native_dropout_backward.default: native_dropout_backward,
}
"""aten overload -> its faster implementation, for nodes that run on the CPU."""


def implementation(node: torch.fx.Node) -> Callable[..., object]:
    """What runs fx node `node` (a call_function): its faster CPU implementation where it has
    one and runs on the CPU, else its target."""
    fast = FAST_CPU.get(node.target)
    if fast is not None and device_of(node).type == "cpu":
        return fast
    return node.target
