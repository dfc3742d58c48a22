"""The check executor.compile makes before handing a model over (`executor/compiled/check.py`
over `executor/check.py`):
a step that differs from the reference is a CompileError naming the first differing value
(the loss, a gradient, a buffer), exact mode refuses any difference, the tolerance mode one
above rtol relative to the value's largest magnitude; the model's state is left as found."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import executor
from executor.check import relative_difference
from executor.compiled.check import LossStep, check_compiled

pytestmark = pytest.mark.usefixtures("one_thread")


def _net() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 1)), (
        torch.randn(6, 4),
    )


def _check(model, call, reference, inputs, exact: bool, rtol: float = 1e-3):
    return check_compiled(
        model,
        call,
        reference,
        LossStep(inputs, {}, lambda out: out.square().mean()),
        exact=exact,
        options=executor.CompileCheck(rtol=rtol),
        reference_name="the reference",
        random_ops=False,
    )


def test_the_same_step_passes_bit_for_bit_and_leaves_the_state_as_found():
    model, inputs = _net()
    before = [b.clone() for b in model.buffers()]
    report = _check(model, model, model, inputs, exact=True)
    assert report.worst == 0.0 and report.values == 1 + 6 + 3
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True))


def test_a_scaled_gradient_is_refused_naming_it():
    """A step whose last layer's weight gradient is 1% off: the first differing value named."""
    model, inputs = _net()

    def off(*args):
        out = model(*args)
        model[3].weight.register_hook(lambda g: g * 1.01)
        return out

    with pytest.raises(executor.CompileError, match=r"grad of 3\.weight \(relative"):
        _check(model, off, model, inputs, exact=False)


def test_exact_mode_refuses_a_rounding_difference_the_tolerance_admits():
    model, inputs = _net()

    def rounded(*args):
        return model(*args) * (1 + 2**-20)

    with pytest.raises(executor.CompileError, match=r"the loss .*not bit for bit"):
        _check(model, rounded, model, inputs, exact=True)
    assert _check(model, rounded, model, inputs, exact=False).worst < 1e-5


def test_relative_difference_is_to_the_largest_magnitude_and_inf_on_mismatched_nans():
    ref = torch.tensor([100.0, 1e-6, 0.0])
    assert relative_difference(ref + torch.tensor([0.0, 1e-3, 0.0]), ref) == pytest.approx(1e-5)
    assert relative_difference(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0])) == (
        float("inf")
    )
    assert relative_difference(torch.ones(2), torch.ones(3)) == float("inf")


def test_a_floor_scales_a_reference_that_is_rounding_noise():
    # a gradient that cancels to rounding noise (BERT's key bias: at most 9e-13 in eager)
    noise = torch.tensor([9e-13, -4e-13], dtype=torch.float64)
    other = torch.tensor([-5e-13, 2e-13], dtype=torch.float64)
    assert relative_difference(other, noise) == pytest.approx(14 / 9)
    assert relative_difference(other, noise, floor=1e-3) == pytest.approx(1.4e-9)
    assert relative_difference(torch.zeros(2), torch.zeros(2) + 1e-13) == 1.0
    big = torch.tensor([2.0, 0.0], dtype=torch.float64)
    assert relative_difference(big + 0.002, big, floor=1e-3) == pytest.approx(1e-3)


def test_a_gradient_that_cancels_may_differ_as_far_as_the_reference_differs_from_eager():
    """A BatchNorm's bias before a linear layer and another BatchNorm in training mode has an
    analytically zero gradient: rounding noise, which each partition rounds differently
    (EfficientNet's projection BatchNorms: 7e-6 apart where the value is 5e-6 and the largest
    gradient 317). Such a value (at most `CompileCheck.small` of the largest gradient) passes
    where it is within `CompileCheck.factor` times the reference's own distance from eager
    (`CheckReport.noise` names it); where the reference equals eager on it, or on a value of
    the step's size however far the reference is from eager, the tolerance is ``rtol``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)
    )
    inputs = (torch.randn(6, 4),)
    model(*inputs).square().mean().backward()
    noise = model[1].bias.grad.abs().max().item()
    largest = max(p.grad.abs().max().item() for p in model.parameters())
    model.zero_grad(set_to_none=True)
    assert noise < 1e-6 * largest, "the bias gradient cancels"

    def shifted(index: int, by: float):
        """The model's step with ``by`` added to one bias's gradient (a hook for one step)."""

        def call(*args):
            out = model(*args)

            def once(grad):
                handle.remove()
                return grad + by

            handle = model[index].bias.register_hook(once)
            return out

        return call

    # both partitions round the noise differently, each as far from eager as the other
    report = _check(model, shifted(1, -noise), shifted(1, noise), inputs, exact=False)
    assert report.noise == ("grad of 1.bias",) and report.worst < 1e-3
    # the reference equals eager there: the difference is a defect, not noise
    with pytest.raises(executor.CompileError, match=r"grad of 1\.bias .*times its own distance"):
        _check(model, shifted(1, noise), model, inputs, exact=False)
    # a gradient of the step's size is held to rtol, however far the reference is from eager
    with pytest.raises(executor.CompileError, match=r"grad of 4\.bias"):
        _check(model, shifted(4, -0.01 * largest), shifted(4, 0.01 * largest), inputs, False)
