"""The CPU convolution workspace model (`graph_capture.measurement.conv_workspace`, as
`cpu_workspace` applies it) against the scratch the profiler's allocation events measure on
real tensors, one call after a warm one (as capture measures each op): equal where the model is
exact, above the measured bytes where it is a bound. One thread, as the model's per-thread
terms were measured."""

from __future__ import annotations

import pytest
import torch

from graph_capture.measurement.peak import measure_each
from graph_capture.measurement.workspace import cpu_workspace

aten = torch.ops.aten
EXACT, BOUND = "exact", "bound"

# (batch, in channels, out channels, image side, kernel, stride, groups, bias, strided: the input
# and the output gradient non-contiguous), then the model's kind for the forward, the backward
# with an input gradient, and the backward without one. Padding: half the kernel, 0 for a kernel
# no larger than its stride (patches).
CASES = [
    ((2, 16, 16, 8, 3, 1, 1, False, False), (EXACT, EXACT, EXACT)),  # ResNet's 3x3
    ((2, 64, 128, 8, 3, 2, 1, False, False), (EXACT, EXACT, EXACT)),  # strided, brgconv hidden
    ((2, 16, 32, 8, 3, 2, 1, False, False), (EXACT, BOUND, EXACT)),  # brgconv's scratchpad
    ((2, 3, 16, 16, 7, 2, 1, False, False), (EXACT, BOUND, EXACT)),  # first layer
    ((2, 8, 8, 4, 3, 1, 1, False, False), (EXACT, EXACT, EXACT)),  # AVX2 weight gradient
    ((2, 12, 12, 8, 3, 1, 1, False, False), (EXACT, EXACT, EXACT)),
    ((2, 16, 32, 8, 1, 2, 1, False, False), (EXACT, BOUND, EXACT)),  # rtus
    ((2, 64, 64, 4, 1, 2, 1, True, False), (EXACT, BOUND, EXACT)),  # rtus, bias gradient
    ((2, 16, 16, 8, 1, 1, 1, False, False), (EXACT, EXACT, EXACT)),  # Slow2d, no columns
    ((1, 16, 16, 8, 3, 1, 1, False, False), (EXACT, EXACT, EXACT)),  # Slow2d's columns
    ((16, 16, 16, 8, 1, 1, 1, False, False), (EXACT, EXACT, EXACT)),  # oneDNN's 1x1
    ((2, 24, 24, 8, 3, 2, 24, False, False), (EXACT, EXACT, EXACT)),  # depthwise
    ((2, 32, 32, 8, 3, 1, 2, False, False), (EXACT, EXACT, EXACT)),  # grouped
    ((2, 40, 40, 8, 5, 1, 40, False, False), (EXACT, EXACT, EXACT)),  # depthwise 5x5: GEMM
    ((2, 5, 16, 8, 3, 1, 1, False, False), (BOUND, BOUND, BOUND)),  # not modelled
    ((2, 16, 16, 8, 3, 1, 1, False, True), (EXACT, EXACT, EXACT)),  # their contiguous copies
    ((2, 3, 32, 16, 8, 8, 1, True, True), (EXACT, BOUND, EXACT)),  # ViT's patches
    ((1, 16, 16, 8, 3, 1, 1, False, True), (EXACT, EXACT, EXACT)),  # Slow2d's copies
]


def _case(shape: tuple) -> tuple[list, list]:
    """The case's three calls and the model's bytes for each."""
    n, c, o, side, k, stride, groups, bias, strided = shape
    x, w = torch.randn(n, c, side, side), torch.randn(o, c // groups, k, k)
    if strided:
        x = x.transpose(2, 3)
    params = ([stride] * 2, [k // 2 if k > stride else 0] * 2, [1, 1], False, [0, 0], groups)
    forward = (x, w, torch.randn(o) if bias else None, *params)
    y = aten.convolution.default(*forward)
    grad = torch.randn_like(y)
    if strided:  # as a patch embedding's flatten and transpose leave it
        grad = grad.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    backwards = [
        (grad, x, w, [o] if bias else None, *params, [data, True, bias]) for data in (True, False)
    ]
    calls = [lambda: aten.convolution.default(*forward)] + [
        lambda a=a: aten.convolution_backward.default(*a) for a in backwards
    ]
    modelled = [cpu_workspace(aten.convolution.default, forward, {}, y)]
    modelled += [cpu_workspace(aten.convolution_backward.default, a, {}, None) for a in backwards]
    return calls, modelled


def _measure_all(shapes: list[tuple]) -> dict[tuple, tuple[list[int], list[int]]]:
    """Each case's (modelled, measured) bytes, all measured in one profiler session."""
    torch.manual_seed(0)
    cases = {shape: _case(shape) for shape in shapes}
    calls = [call for c, _ in cases.values() for call in c for _ in range(2)]
    scratch = [p.peak_bytes - p.end_bytes for p in measure_each(calls)[1::2]]
    return {
        shape: (modelled, scratch[3 * i : 3 * i + 3])
        for i, (shape, (_, modelled)) in enumerate(cases.items())
    }


@pytest.fixture(scope="module")
def measured(one_thread) -> dict[tuple, tuple[list[int], list[int]]]:
    return _measure_all([shape for shape, _ in CASES])


@pytest.mark.parametrize(("shape", "kinds"), CASES, ids=[str(c[0]) for c in CASES])
def test_conv_workspace_is_the_measured_scratch(measured, shape, kinds):
    modelled, real = measured[shape]
    for kind, model, bytes_ in zip(kinds, modelled, real, strict=True):
        if kind == EXACT:
            assert model == bytes_, (modelled, real)
        else:
            assert model > bytes_, (modelled, real)


def test_conv_workspace_bounds_the_measured_scratch_on_two_threads(one_thread):
    """oneDNN's kernels hold per-thread buffers the one-thread model does not: on two threads
    the model, with its allowance per thread, is never under the measured scratch."""
    torch.set_num_threads(2)
    try:
        both = _measure_all([CASES[i][0] for i in (0, 3, 4, 7, 8, 13, 15)])
    finally:
        torch.set_num_threads(1)
    for shape, (modelled, real) in both.items():
        assert all(m >= r for m, r in zip(modelled, real, strict=True)), (shape, modelled, real)
