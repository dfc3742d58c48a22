"""Dropout on low-precision CPU tensors, traced as eager CPU runs it.

Tracing decomposes ``aten.dropout`` into ``native_dropout``, the fused kernel eager uses on CUDA.
On the CPU eager takes another path (``_dropout_impl``): ``noise = empty_like(x).bernoulli_(1 -
p); noise.div_(1 - p); out = x * noise``, whose backward is ``grad * noise``. In float32 the two
agree bit for bit; in bfloat16 and float16 they do not: eager rounds the scale 1 / (1 - p) to
the tensor's dtype (1.109375 in bfloat16 for p = 0.1), the fused kernel multiplies by it in
float32. `dropout_as_eager_cpu` rewrites such nodes of a joint graph into `eager_cpu_dropout`
(same draws, same roundings: outputs and noise) and their ``native_dropout_backward`` into
``grad * noise``, so a model under CPU autocast (or cast to bfloat16) replays eager exactly.
The noise is kept in the input's dtype, as eager keeps it (the fused kernel keeps a bool mask).
"""

from __future__ import annotations

import operator

import torch

__all__ = ["dropout_as_eager_cpu", "eager_cpu_dropout"]

LOW_PRECISION = (torch.bfloat16, torch.float16)


@torch.library.custom_op(
    "remat::eager_cpu_dropout", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def eager_cpu_dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * noise, noise) with noise drawn and scaled exactly as eager CPU dropout does."""
    noise = torch.empty_like(x).bernoulli_(1 - p)
    noise.div_(1 - p)
    return x * noise, noise


@eager_cpu_dropout.register_fake
def _(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def dropout_as_eager_cpu(gm: torch.fx.GraphModule) -> int:
    """Rewrite every training-mode ``native_dropout`` of a bfloat16/float16 CPU tensor whose
    mask only its ``native_dropout_backward`` reads (module docstring). Returns the count."""
    rewritten = 0
    for node in list(
        gm.graph.find_nodes(op="call_function", target=torch.ops.aten.native_dropout.default)
    ):
        x, p, train = node.args
        val = x.meta.get("val")
        if train is False or not isinstance(val, torch.Tensor):
            continue
        if val.device.type != "cpu" or val.dtype not in LOW_PRECISION:
            continue
        masks = [u for u in node.users if u.target is operator.getitem and u.args[1] == 1]
        readers = [r for m in masks for r in m.users]
        if any(r.target is not torch.ops.aten.native_dropout_backward.default for r in readers):
            continue
        node.target, node.args = torch.ops.remat.eager_cpu_dropout.default, (x, p)
        with val.fake_mode:
            node.meta["val"] = (torch.empty_like(val), torch.empty_like(val))
        for mask in masks:
            mask.meta["val"] = node.meta["val"][1]
        for reader in readers:
            grad, mask, _scale = reader.args
            reader.target, reader.args = torch.ops.aten.mul.Tensor, (grad, mask)
        rewritten += 1
    return rewritten
