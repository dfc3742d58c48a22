"""An op's workspace bytes on a target device: what its kernel allocates and frees within the
call beyond its outputs (scratch no output holds, which fake tensors do not show).

`workspace_bytes` is the one model both estimate paths use: the traced-graph estimate
(`graph_capture.measurement.estimate`, each fx node's ``scratch_bytes``, from which the DAG's
``op_transient`` follows) and the SAC recording's `executor.sac.recording.estimate.Estimate` (each
op's scratch and a transient allocation in the step's timeline, so the windows' peaks hold it).

In order: a device's measured table (`Device.op_transient`, ``remat calibrate``) where it has
the op's key; else, for aten's CPU kernels (``Device.kernels == "cpu"``), the formulas below,
read from the kernels and checked against the bytes capture measures on real tensors
(`graph_capture.measurement.measure`, each op's scratch) on the zoo models (benchmarks/zoo);
else 0 (CUDA: docs/estimate.md says what is and is not modelled).

CPU formulas (``numel`` and bytes of the op's tensors; float32 ``acc`` for accumulation):

- ``convolution`` and ``convolution_backward``: `graph_capture.measurement.conv_workspace`
  (the kernel torch picks and the buffers it holds; exact at one thread on every convolution
  of the zoo's ResNet-18, ViT and MobileNetV3-small, a bound where that module says).
- batch norm forward in training: float vectors of the channels' size, 2 (functional, traced
  graph) or 3 (eager ``native_batch_norm``) x C x 4; backward: one tensor of the input's size
  (exact on ResNet-18 and MobileNetV3).
- ``native_layer_norm_backward``: per-thread float buffers of the weight's and bias's
  gradients, 2 x threads x (normalized numel) x 4 (exact).
- ``native_dropout`` and its backward: the mask in the input's dtype (bernoulli draws it in
  float, the kernel casts it to bool; the backward casts it back): numel x element size
  (exact).
- ``_safe_softmax``: the ``-inf`` mask (bool, numel), its all-reduction over ``dim`` (bool,
  numel / size(dim)) and the wrapped 0 (4 bytes) (exact).
- ``cumsum`` of a bool or narrower integer: the int64 copy, numel x 8; ``embedding`` and
  ``embedding_dense_backward``: the indices as int64, numel x 8 (exact on BERT, GPT-2).
- a Python number operand of a pointwise op (``mul.Scalar``, ``add.Tensor`` with a float,
  ``mean.dim``'s divisor): the wrapped number, 8 bytes, plus its cast to a 4- or 2-byte
  dtype (exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Number
from typing import Any

import torch
import torch.utils._pytree as pytree

from graph_capture.measurement.conv_workspace import (
    conv_backward_workspace,
    conv_workspace,
    tensor_bytes,
)
from graph_capture.measurement.roofline import target_key
from solver.target import Device

__all__ = ["cpu_workspace", "workspace_bytes"]

aten = torch.ops.aten


def workspace_bytes(
    device: Device, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any
) -> int:
    """Workspace bytes of one call of ``func`` on ``device`` (module docstring): measured where
    the device's table has the op, else its kernels' model."""
    measured = device.op_transient.get(target_key(func, args, kwargs))
    if measured is not None:
        return measured
    if device.kernels == "cpu":
        return device.round_bytes(cpu_workspace(func, args, kwargs, out))
    return 0


def _outputs(out: Any) -> int:
    return sum(tensor_bytes(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))


def _batch_norm(statistics: int) -> Callable[[tuple, dict, Any], int]:
    """`statistics` float vectors of the channels' size (mean, inverse deviation, ...)."""
    return lambda args, kwargs, out: statistics * args[0].shape[1] * 4 if args[0].dim() > 1 else 0


def _layer_norm_backward(args: tuple, kwargs: dict, out: Any) -> int:
    return 2 * torch.get_num_threads() * math.prod(args[2]) * 4


def _safe_softmax(args: tuple, kwargs: dict, out: Any) -> int:
    x, dim = args[0], args[1]
    size = x.shape[dim] if x.dim() else 1
    return x.numel() + x.numel() // max(size, 1) + 4


def _as_int64(args: tuple, kwargs: dict, out: Any) -> int:
    x = args[0]
    return x.numel() * 8 if x.element_size() < 8 and not x.is_floating_point() else 0


def _indices(position: int) -> Callable[[tuple, dict, Any], int]:
    return lambda args, kwargs, out: args[position].numel() * 8


def _first_input(args: tuple, kwargs: dict, out: Any) -> int:
    return tensor_bytes(args[0])


_CPU: dict[Any, Callable[[tuple, dict, Any], int]] = {
    aten.convolution.default: conv_workspace,
    aten.convolution_backward.default: conv_backward_workspace,
    aten._native_batch_norm_legit_functional.default: _batch_norm(2),
    aten._native_batch_norm_legit.default: _batch_norm(3),
    aten.native_batch_norm.default: _batch_norm(3),
    aten.native_batch_norm_backward.default: _first_input,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.native_dropout.default: _first_input,
    aten.native_dropout_backward.default: _first_input,
    aten._safe_softmax.default: _safe_softmax,
    aten.cumsum.default: _as_int64,
    aten.embedding.default: _indices(1),
    aten.embedding_dense_backward.default: _indices(1),
}

_NUMBER_OVERLOADS = ("Scalar", "Tensor", "Scalar_Tensor")


def _wrapped_number(func: torch._ops.OpOverload, args: tuple) -> int:
    """Bytes of a Python number operand of a pointwise op (or ``mean``'s divisor) as aten wraps
    it: a 0-dim 8-byte tensor, cast to the op's dtype where that is narrower."""
    if func.overloadpacket is aten.mean:
        numbered = True
    else:
        numbered = func._overloadname in _NUMBER_OVERLOADS and any(
            isinstance(a, Number) and not isinstance(a, bool) for a in args[1:]
        )
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if not numbered or tensor is None:
        return 0
    size = tensor.element_size()
    return 8 + (size if size < 8 and tensor.dtype != torch.bool else 0)


def cpu_workspace(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """Workspace bytes of one call of ``func`` on aten's CPU kernels (module docstring), before
    the allocator's rounding."""
    rule = _CPU.get(func)
    if rule is not None:
        return rule(args, kwargs, out)
    return _wrapped_number(func, args)
