"""SAC plans on models with state: BatchNorm's running statistics updated once per step (not
again by the recompute), HF models with their default config (`use_cache=True`: the KV cache is
off inside checkpointed regions, as under HF's own gradient checkpointing, so the reference is
eager with the cache off), forwards without
grad (the plain forward runs), and a block whose list argument the caller appends to after the
call (DenseNet). Loss, gradients and buffers `torch.equal` to the model without the plan over
3 AdamW steps."""

from __future__ import annotations

import copy

import pytest
import torch
from sac_models import assert_same_adamw_steps, every_saveable, replanned, sum_loss
from torch import nn

import executor

pytestmark = pytest.mark.usefixtures("one_thread")


class ConvBlock(nn.Module):
    def __init__(self, c: int, momentum: float | None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c, momentum=momentum)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.relu(self.bn(self.conv(x))))


def cnn(momentum: float | None, layers: int = 3, c: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1),
        nn.Sequential(*(ConvBlock(c, momentum) for _ in range(layers))),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(c, 4),
    ).train()


def plan_variants(model, args, kwargs=None, budget="min") -> list:
    """The model, the plan applied, and the plan's regions saving every op they may and none."""
    loss_fn = sum_loss if kwargs is None else executor.default_loss  # HF: output.loss
    plan = executor.checkpoint_plan(
        model, args, budget, example_kwargs=kwargs, time_limit=60, loss_fn=loss_fn
    )
    assert plan.checkpointed_regions(), "the plan should checkpoint"
    every = every_saveable(plan)
    runs = [copy.deepcopy(model), plan.apply(copy.deepcopy(model))]
    for saved in (every, tuple(frozenset() for _ in every)):
        runs.append(replanned(plan, saved)[0].apply(copy.deepcopy(model)))
    return runs


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_statistics_match_eager(momentum):
    x = torch.randn(4, 3, 8, 8)
    runs = plan_variants(cnn(momentum), (x,))
    assert_same_adamw_steps(runs, lambda m, step: m(x + step).square().mean())
    assert int(runs[1][1][0].bn.num_batches_tracked) == 3


def test_eval_mode_with_grad_matches_eager():
    x = torch.randn(4, 3, 8, 8)
    runs = [m.eval() for m in plan_variants(cnn(0.1), (x,))]
    assert_same_adamw_steps(runs, lambda m, step: m(x + step).square().mean())


class DenseLayer(nn.Module):
    """torchvision's `_DenseLayer` in small: takes the list of the features so far."""

    def __init__(self, c: int, grow: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(c), nn.Conv2d(c, 8 * grow, 1)
        self.bn2, self.conv2 = nn.BatchNorm2d(8 * grow), nn.Conv2d(8 * grow, grow, 3, padding=1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(torch.relu(self.bn1(torch.cat(features, 1))))
        return self.conv2(torch.relu(self.bn2(x)))


class DenseBlock(nn.Module):
    def __init__(self, c: int = 4, grow: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(c + k * grow, grow) for k in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def test_growing_list_argument_matches_eager():
    torch.manual_seed(0)
    net, x = DenseBlock().train(), torch.randn(2, 4, 6, 6)
    runs = plan_variants(net, (x,))
    assert_same_adamw_steps(runs, lambda m, step: m(x + step).square().mean())


transformers = pytest.importorskip("transformers")
from graph_capture.models.hf_models import gpt2_lm, llama_lm, t5_lm  # noqa: E402


@pytest.mark.parametrize("make", [gpt2_lm, llama_lm, t5_lm])
def test_hf_default_config_with_cache_matches_eager_with_the_cache_off(make):
    """The guarantee with HF's KV cache: a plan called with the default config (``use_cache``
    on) runs its checkpointed regions with the cache off, as HF's own gradient checkpointing
    does, and equals eager called with ``use_cache=False`` bit for bit. Eager with the cache on
    is not the reference: its attention reads keys and values through the cache's tensors,
    whose matmuls may take another kernel path (transformers 5.25 on some processors: GPT-2's
    c_attn gradients 7.3e-12 apart from the cache-off run)."""
    torch.manual_seed(0)
    model, args, kwargs = make(batch=2, seq=8, layers=2, width=16)
    assert model.config.use_cache
    runs = plan_variants(model, args, kwargs)
    eager = runs[0]
    off = {**kwargs, "use_cache": False}
    assert_same_adamw_steps(runs, lambda m, _: m(*args, **(off if m is eager else kwargs)).loss)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_forward_without_grad_runs_plain(mode):
    torch.manual_seed(0)
    model, args, kwargs = gpt2_lm(batch=2, seq=8, layers=2, width=16)
    runs = plan_variants(model, args, kwargs)
    policies = [getattr(m, "remat_sac_policy", None) for m in runs[2].modules()]
    assert any(p is not None and p.saved for p in policies), "a region should save ops"
    outs = []
    for m in runs:
        torch.manual_seed(0)
        with mode():
            outs.append(m(*args, **kwargs).logits)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
