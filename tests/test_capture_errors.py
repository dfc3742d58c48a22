"""Bad input gets a `CaptureError` that says what failed and where, never a wrong graph."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graph_capture import CaptureError, capture


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate(x)
        return h * 2 if h.sum() > 0 else h


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = DataDependent()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class NonTensorOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return self.lin(x), 3


class MutatesInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.lin(x)


class InPlaceInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h.mul_(2)
        return h.relu_().sum()


class BreaksAutograd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.lin(x))
        return h.add_(1).sum()


def test_data_dependent_control_flow_names_the_module(capfd) -> None:
    with pytest.raises(CaptureError, match=r"module 'inner'.*data-dependent"):
        capture(Outer(), (torch.randn(2, 4),))
    assert "def forward" not in capfd.readouterr().err  # torch's partial graph is held back


class MaskedSelect(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h[h > 0].sum()


def test_data_dependent_shape_names_the_op_and_module() -> None:
    model = nn.Sequential(nn.Identity(), MaskedSelect())
    with pytest.raises(CaptureError, match=r"at op aten.index.Tensor in module '1'"):
        capture(model, (torch.randn(2, 4),))


def test_model_without_trainable_parameters_is_rejected() -> None:
    model = nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(CaptureError, match="no parameters that require grad"):
        capture(model, (torch.randn(2, 4),))


def test_non_tensor_output_is_rejected() -> None:
    with pytest.raises(CaptureError, match="output 1 is not a tensor"):
        capture(NonTensorOutput(), (torch.randn(2, 4),))


def test_non_tensor_input_is_rejected() -> None:
    with pytest.raises(CaptureError, match="example input 1 is a float"):
        capture(nn.Linear(4, 4), (torch.randn(2, 4), 0.5))


def test_input_mutation_is_rejected() -> None:
    with pytest.raises(CaptureError, match="mutates its input"):
        capture(MutatesInput(), (torch.randn(2, 4),))


def test_eval_mode_is_rejected() -> None:
    with pytest.raises(CaptureError, match="eval mode"):
        capture(nn.Linear(4, 4).eval(), (torch.randn(2, 4),))


@pytest.mark.usefixtures("one_thread")
def test_in_place_ops_on_intermediates_are_functionalized_exactly() -> None:
    model, x = InPlaceInside(), torch.randn(3, 4)
    graph = capture(model, (x,), repeats=1)
    ops = {str(n.target) for n in graph.joint.graph.nodes if n.op == "call_function"}
    assert not any(op.split(".")[1].endswith("_") for op in ops if op.startswith("aten."))
    result = graph.run_plain(model, [x], graph.default_tangents())
    model(x).backward()
    assert torch.equal(result.param_grads["lin.weight"], model.lin.weight.grad)


def test_in_place_op_that_breaks_the_backward_names_the_op() -> None:
    model = nn.Sequential(nn.Identity(), BreaksAutograd())
    with (
        pytest.warns(UserWarning, match="Error detected in SigmoidBackward0"),
        pytest.raises(CaptureError, match=r"(?s)at op sigmoid in module '1'.*inplace operation"),
    ):
        capture(model, (torch.randn(3, 4),))


def test_wrong_input_shape_names_the_difference() -> None:
    model = nn.Linear(4, 4)
    graph = capture(model, (torch.randn(2, 4),), repeats=1)
    with pytest.raises(CaptureError, match=r"input 0: captured with shape \(2, 4\)"):
        graph.run_plain(model, [torch.randn(3, 4)], graph.default_tangents())


@torch.library.custom_op("remat_test::fails_on_real_tensors", mutates_args=())
def fails_on_real_tensors(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel refused these tensors")


@fails_on_real_tensors.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


fails_on_real_tensors.register_autograd(lambda ctx, grad: grad)


class CallsFailingOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fails_on_real_tensors(self.lin(x)).sum()


def test_op_failing_while_measured_names_the_op_and_module() -> None:
    model = nn.Sequential(nn.Identity(), CallsFailingOp())
    with pytest.raises(
        CaptureError,
        match=r"op remat_test.fails_on_real_tensors.default .* in module '1' failed on the "
        r"example tensors: RuntimeError: kernel refused these tensors",
    ):
        capture(model, (torch.randn(2, 4),), repeats=1)


def test_non_tensor_keyword_input_is_rejected() -> None:
    with pytest.raises(CaptureError, match="example keyword input 'scale' is a float"):
        capture(nn.Linear(4, 4), (torch.randn(2, 4),), example_kwargs={"scale": 0.5})
