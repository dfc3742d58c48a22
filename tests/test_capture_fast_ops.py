"""The faster CPU implementations of aten ops: the same bits and the same draws as the kernels,
and the executor's generated code runs them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import solver
from executor.traced.module import Rematerialized
from graph_capture import capture
from graph_capture.measurement.fast_ops import (
    implementation,
    native_dropout,
    native_dropout_backward,
)

pytestmark = pytest.mark.usefixtures("one_thread")

aten = torch.ops.aten


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtypes, shapes and strides, and equal bits (a -0.0 is not a 0.0; a nan is equal to
    a nan of the same bits)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def both_dropouts(x: torch.Tensor, p: float, train: bool | None, seed: int):
    """The kernel's and the fast implementation's (output, mask) from the same generator state,
    and the generator states each leaves."""
    results, states = [], []
    for run in (aten.native_dropout.default, native_dropout):
        torch.manual_seed(seed)
        results.append(run(x, p, train))
        states.append(torch.get_rng_state())
    return results, states


@settings(max_examples=40)
@given(
    shape=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    p=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
    train=st.sampled_from([None, True, False]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_native_dropout_gives_the_kernels_bits_and_draws(shape, p, train, dtype, transposed, seed):
    torch.manual_seed(seed + 1)
    x = torch.randn(shape).to(dtype)
    x[x.abs() < 0.3] = -0.0  # negative zeros keep their sign through a multiply by 1
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1)
    ((out, mask), (fast_out, fast_mask)), (state, fast_state) = both_dropouts(x, p, train, seed)
    assert same_bits(out, fast_out)
    assert same_bits(mask, fast_mask)
    assert torch.equal(state, fast_state)


@settings(max_examples=30)
@given(
    shape=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    scale=st.sampled_from([0.0, 1.0, 1 / 0.9, 2.0, 10.0]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_native_dropout_backward_gives_the_kernels_bits(shape, scale, dtype, seed):
    torch.manual_seed(seed)
    grad = torch.randn(shape).to(dtype)
    grad[grad.abs() < 0.3] = -0.0
    grad.view(-1)[:1] = float("inf")  # inf * 0.0 is nan in both
    mask = torch.rand(shape) > 0.3
    expected = aten.native_dropout_backward.default(grad, mask, scale)
    assert same_bits(native_dropout_backward(grad, mask, scale), expected)


def test_a_mask_that_is_not_bool_goes_to_the_kernel():
    grad, mask = torch.randn(3, 4), torch.rand(3, 4)
    expected = aten.native_dropout_backward.default(grad, mask, 2.0)
    assert same_bits(native_dropout_backward(grad, mask, 2.0), expected)


def test_only_nodes_on_the_cpu_run_the_faster_implementation():
    def dropout_node(device: str):
        x = torch.empty(2, 3, device=device)
        gm = make_fx(lambda t: aten.native_dropout.default(t, 0.5, True), tracing_mode="fake")(x)
        (node,) = [n for n in gm.graph.nodes if n.target is aten.native_dropout.default]
        return node

    cpu_node, meta_node = dropout_node("cpu"), dropout_node("meta")
    assert implementation(cpu_node) is native_dropout
    assert implementation(meta_node) is aten.native_dropout.default


class _DropoutKernels(TorchDispatchMode):
    """Counts the calls that reach the dropout kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (aten.native_dropout.default, aten.native_dropout_backward.default)
        return func(*args, **(kwargs or {}))


def test_a_step_under_a_schedule_runs_no_dropout_kernel():
    """The generated code runs the faster implementations in the forward, the recomputations
    and the backward (no call reaches the kernels, which convert every mask), and the gradients
    are the plain step's."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.Dropout(0.3), nn.GELU(), nn.Linear(32, 32), nn.Dropout(0.3),
        nn.GELU(), nn.Linear(32, 4),
    )  # fmt: skip
    x = torch.randn(64, 8)
    captured = capture(model, (x,))
    least = solver.solve(captured.dag, objective="memory", time_limit=5).peak
    full = solver.checkpoint_all_peak(solver.prepare(captured.dag))
    schedule = solver.solve(captured.dag, budget=(least + full) // 2, time_limit=5)
    assert schedule.recomputes > 0
    rm = Rematerialized(model, captured, schedule)
    mode = _DropoutKernels()
    torch.manual_seed(1)
    with mode:
        rm(x).sum().backward()
    assert mode.count == 0
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    model(x).sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters(), strict=True))
