"""Workspace bytes of aten's CPU convolutions (float32, 2-d, NCHW): the kernel torch picks
and, for oneDNN, the buffers its calls hold, read from ATen's ``Convolution.cpp``,
``mkldnn/Conv.cpp`` and ``ConvolutionMM2d.cpp`` and oneDNN's verbose log (``ONEDNN_VERBOSE=1``:
each primitive's implementation and memory formats), checked against the profiler's allocation
events on every convolution of the zoo's ResNet-18 and MobileNetV3-small and a grid of shapes
(tests/test_estimate_conv_workspace.py).

The kernel: ``torch._C._select_conv_backend``, torch's own choice from the shapes and the
thread count (a 1x1, stride-1 convolution of a batch under 16 on one thread runs ``Slow2d``).

Every kernel first copies a non-contiguous operand (``.contiguous()`` in ``_convolution`` and
``convolution_backward``; a patch embedding's output gradient is one) and holds the copy for the
call: its bytes add to the kernel's below.

- ``Slow2d`` (``slow_conv2d``): the im2col columns, ``N x C*kh*kw x Ho*Wo`` floats, forward and
  each backward half (one at a time); none for a 1x1, stride-1, unpadded kernel (a view).
- ``Mkldnn``: ATen reorders each operand to the layout oneDNN's primitive chose, the primitive
  writes a oneDNN-owned output, then ``mkldnn_to_dense`` copies it out. The scratch is the most
  bytes held at once over those phases less the op's outputs. Layouts on this build (AVX-512):
  activations ``aBcd16b`` (channels padded to 16); an input of under 16 channels stays plain in
  the forward (oneDNN's first-layer kernel, weights ``Acdb16a``); weights padded to 16 on both
  channel dims (per group); depthwise weights ``Abcde16a``. The weight gradient of an input of
  8-15 channels runs the AVX2 kernel (blocks of 8), of 1-3 channels the first-layer kernel.
  A strided 1x1 kernel copies the strided input per thread (``rtus``: ``C x Ho x Wo`` floats)
  in a scratchpad `SCRATCHPAD_ALIGNMENT` larger. A depthwise kernel over 3x3 computes its
  weight gradient by GEMM on the plain operands, its scratchpad per thread 4 x the weight's
  bytes and one channel's im2col (``kh*kw x Ho*Wo`` floats), plus 2 x `SCRATCHPAD_ALIGNMENT`.
  All of this is exact at one thread (and the GEMM and ``rtus`` scratchpads at two). Bounds,
  with allowances measured here, not derived:

  - a strided, non-depthwise input gradient runs ``brgconv_strided`` in ``acdb`` (NHWC):
    unpadded activations, weights' input channels padded to 16, 32 or 64, a scratchpad of at
    most `BRGCONV_SCRATCH_BYTES` per thread plus the output gradient's bytes, and
    ``mkldnn_to_dense`` holding three copies of the input gradient;
  - more than one thread: each thread beyond the first adds a partial weight gradient to the
    weight phase and `THREAD_BYTES` to the call (checked at two threads, never under).

Anything else (another kernel, dtype, a channels-last input or weight, dilation, transposed,
3-d, channels per group not a multiple of 16, 4-7 input channels, a 1x1 kernel on under 16
channels, a bias gradient with a depthwise kernel over 3x3) gets `operand_bound`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["conv_backward_workspace", "conv_workspace", "operand_bound", "tensor_bytes"]

SIMD = 16
"""oneDNN's channel block for float32 on AVX-512."""
SCRATCHPAD_BYTES = 64 << 10
"""`operand_bound`'s allowance per call for oneDNN's scratchpad (not derived)."""
SCRATCHPAD_ALIGNMENT = 128
"""Bytes oneDNN's scratchpad adds to a booked buffer (measured, with every ``rtus`` copy)."""
THREAD_BYTES = 32 << 10
"""An allowance per oneDNN call for each thread beyond the first: oneDNN's kernels hold
per-thread buffers (partial weight gradients, blocks) the one-thread model does not; the most
measured beyond it at two threads was 20,736 B (a 1x1 convolution with bias)."""
BRGCONV_SCRATCH_BYTES = 64 << 10
"""An allowance per thread for ``brgconv_strided``'s scratchpad beyond the output gradient's
bytes: the most measured was 56,856 B (one thread, a 1x1 input; 36,888 B at most shapes,
61,488 B on two threads)."""


def _pad(channels: int, block: int = SIMD) -> int:
    return -(-channels // block) * block


def tensor_bytes(t: object) -> int:
    """Bytes of `t`'s elements where it is a tensor (its view, not its storage), else 0."""
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _blocked(t: torch.Tensor, block: int = SIMD) -> int:
    """Bytes of activation `t` with its channels (dim 1) padded to `block`."""
    if t.dim() < 3 or t.shape[1] < 8:
        return tensor_bytes(t)
    return tensor_bytes(t) // t.shape[1] * _pad(t.shape[1], block)


def operand_bound(args: tuple, kwargs: dict, out: Any, backward: bool) -> int:
    """A bound for a convolution no rule covers: every operand once more, as a reorder to
    oneDNN's blocked layout (plus the input again for an input gradient), and
    `SCRATCHPAD_BYTES`."""
    if not backward:
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        operands = _blocked(args[0]) + tensor_bytes(args[1]) + sum(_blocked(t) for t in outs)
        return operands + SCRATCHPAD_BYTES
    grad, x, weight = args[:3]
    mask = _mask(args, kwargs)
    operands = _blocked(grad) + _blocked(x) + tensor_bytes(weight) + (_blocked(x) if mask[0] else 0)
    return operands + SCRATCHPAD_BYTES


def _mask(args: tuple, kwargs: dict) -> tuple[bool, bool, bool]:
    return tuple(args[10] if len(args) > 10 else kwargs.get("output_mask", (True, True, True)))


def _backend(x: torch.Tensor, w: torch.Tensor, bias: Any, params: list, bias_sizes: Any) -> str:
    stride, padding, dilation, transposed, output_padding, groups = params
    backend = torch._C._select_conv_backend(
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups, bias_sizes
    )
    return backend.name


def _channels_last(t: torch.Tensor) -> bool:
    return not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def _copies(*tensors: torch.Tensor) -> int:
    """Bytes of the contiguous copies ``_convolution`` and ``convolution_backward`` make of
    their non-contiguous operands, held for the whole call."""
    return sum(tensor_bytes(t) for t in tensors if not t.is_contiguous())


def _shape(x: torch.Tensor, w: torch.Tensor, params: list) -> tuple | None:
    """(N, C, O, groups, kernel numel, input hw, output hw) where a rule covers the call."""
    stride, padding, dilation, transposed, _, groups = params
    if (
        x.dim() != 4
        or x.dtype != torch.float32
        or w.dtype != torch.float32
        or transposed
        or any(d != 1 for d in dilation)
        or _channels_last(x)
        or _channels_last(w)
    ):
        return None
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho = (h + 2 * padding[0] - kh) // stride[0] + 1
    wo = (wd + 2 * padding[1] - kw) // stride[1] + 1
    return n, c, o, groups, kh * kw, h * wd, ho * wo


def _modelled(c: int, o: int, groups: int, k: int) -> bool:
    """Whether the oneDNN rules cover the call (module docstring)."""
    if groups > 1 and not groups == c == o:
        return (c // groups) % SIMD == 0 and (o // groups) % SIMD == 0
    return groups > 1 or not (4 <= c < 8 or (c < SIMD and k == 1))


def _weight_bytes(c: int, o: int, groups: int, k: int, block: int = SIMD) -> int:
    """Weights in oneDNN's blocked layout: depthwise ``Abcde16a``, else both channel dims
    padded per group."""
    if groups == c == o and groups > 1:
        return _pad(o) * k * 4
    return groups * _pad(o // groups, block) * _pad(c // groups, block) * k * 4


def _threads_allowance() -> int:
    return (torch.get_num_threads() - 1) * THREAD_BYTES


def _rtus(c: int, ohw: int, k: int, stride: list) -> int:
    if k != 1 or all(s == 1 for s in stride):
        return 0
    return torch.get_num_threads() * _pad(c) * ohw * 4 + SCRATCHPAD_ALIGNMENT


def conv_workspace(args: tuple, kwargs: dict, out: Any) -> int:
    """Workspace bytes of one ``aten.convolution`` on the CPU (module docstring)."""
    x, w, bias = args[:3]
    params = list(args[3:9])
    shape = _shape(x, w, params)
    if shape is None:
        return operand_bound(args, kwargs, out, backward=False)
    n, c, o, groups, k, hw, ohw = shape
    backend = _backend(x, w, bias, params, None)
    if backend == "Slow2d":
        return _columns(n, c, k, ohw, params) + _copies(x, w)
    if backend != "Mkldnn" or not _modelled(c, o, groups, k):
        return operand_bound(args, kwargs, out, backward=False)
    y = n * o * ohw * 4
    plain = c < SIMD and groups == 1
    x_b = 0 if plain else n * _pad(c) * hw * 4
    w_b = _pad(o) * c * k * 4 if plain else _weight_bytes(c, o, groups, k)
    y_b = n * _pad(o) * ohw * 4
    rtus = _rtus(c, ohw, k, params[0])
    return max(x_b + w_b + y_b + rtus, y_b + y) - y + _copies(x, w) + _threads_allowance()


def _columns(n: int, c: int, k: int, ohw: int, params: list) -> int:
    stride, padding = params[0], params[1]
    if k == 1 and all(s == 1 for s in stride) and all(p == 0 for p in padding):
        return 0
    return n * c * k * ohw * 4


def _weight_phases(shape: tuple, stride: list, w_bytes: int, gx: int, bias: int) -> list[int]:
    """Bytes held while oneDNN computes the weight gradient (the input gradient `gx` held),
    then while ``mkldnn_to_dense`` copies it out."""
    n, c, o, groups, k, hw, ohw = shape
    threads = torch.get_num_threads()
    if groups == c == o and groups > 1 and k > 9:  # GEMM on plain operands
        scratch = threads * (4 * w_bytes + k * ohw * 4) + 2 * SCRATCHPAD_ALIGNMENT
        return [gx + w_bytes + scratch, gx + 2 * w_bytes]
    if c <= 3 and groups == 1:  # the first-layer kernel: plain input, weights Acdb16a
        gy_w, x_w, gw_w = n * _pad(o) * ohw * 4, 0, _pad(o) * c * k * 4
    else:
        block = 8 if c < SIMD and groups == 1 else SIMD
        gy_w = n * _pad(o, block) * ohw * 4
        x_w = n * _pad(c, block) * hw * 4
        gw_w = _weight_bytes(c, o, groups, k, block)
    reduction = (threads - 1) * (gw_w + SCRATCHPAD_ALIGNMENT)  # partial gradients
    held = gx + gy_w + x_w + gw_w + bias + _rtus(c, ohw, k, stride) + reduction
    return [held, gx + gw_w + w_bytes + 2 * bias]


def conv_backward_workspace(args: tuple, kwargs: dict, out: Any) -> int:
    """Workspace bytes of one ``aten.convolution_backward`` on the CPU (module docstring)."""
    grad, x, w = args[:3]
    params = list(args[4:10])
    shape = _shape(x, w, params)
    if shape is None:
        return operand_bound(args, kwargs, out, backward=True)
    n, c, o, groups, k, hw, ohw = shape
    backend = _backend(x, w, None, params, args[3])
    mask = _mask(args, kwargs)
    if backend == "Slow2d":
        return _columns(n, c, k, ohw, params) + _copies(grad, x, w)
    depthwise = groups == c == o and groups > 1
    if backend != "Mkldnn" or not _modelled(c, o, groups, k) or (depthwise and k > 9 and mask[2]):
        return operand_bound(args, kwargs, out, backward=True)
    stride = params[0]
    x_bytes, w_bytes, gy = n * c * hw * 4, tensor_bytes(w), n * o * ohw * 4
    gx = x_bytes if mask[0] else 0
    phases = [0]
    if mask[0] and any(s > 1 for s in stride) and not depthwise:
        block = 16 if c <= 16 else 32 if c <= 32 else 64
        scratch = torch.get_num_threads() * BRGCONV_SCRATCH_BYTES + gy
        phases += [gy + o * _pad(c, block) * k * 4 + x_bytes + scratch, 3 * x_bytes]
    elif mask[0]:
        gx_b = n * _pad(c) * hw * 4
        phases += [n * _pad(o) * ohw * 4 + _weight_bytes(c, o, groups, k) + gx_b, gx_b + x_bytes]
    bias = mask[2] * o * 4
    if mask[1] or mask[2]:
        phases += _weight_phases(shape, stride, w_bytes, gx, bias)
    outputs = gx + (w_bytes if mask[1] else 0) + bias
    return max(0, max(phases) - outputs) + _copies(grad, x, w) + _threads_allowance()
