"""SAC plans on module structures of third-party model families: default blocks that follow
torchvision's stages, encoder layers and dense blocks, and recording that hands each region
the tensors the model hands it (`nn.MultiheadAttention` called with one tensor three times)."""

from __future__ import annotations

import copy

import pytest
import torch
from sac_models import assert_same_adamw_steps, sum_loss
from torch import nn

import executor
from executor.sac.recording.blocks import default_blocks

pytestmark = pytest.mark.usefixtures("one_thread")


class Residual(nn.Module):
    """A ResNet basic block: two convolutions, BatchNorm, in-place ReLU."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return self.relu(x + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))


class ResNetLike(nn.Module):
    """torchvision's ResNet layout: a stem, stages as attributes, each a Sequential of blocks."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1, self.relu = nn.Conv2d(3, c, 3, padding=1), nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(Residual(c), Residual(c))
        self.layer2 = nn.Sequential(Residual(c), Residual(c))
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.relu(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


def conv_act(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(inplace=True))


def test_default_blocks_are_the_blocks_of_every_stage():
    assert default_blocks(ResNetLike()) == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]


def test_default_blocks_of_a_dict_of_layers():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ModuleDict({"a": conv_act(8, 8), "b": conv_act(8, 8)})
    )
    assert default_blocks(model) == ["1.a", "1.b"]


def test_default_blocks_leave_out_activations_of_a_flat_network():
    """No container of one block class: the largest container's children with parameters
    (an in-place ReLU as a region would write the region's input)."""
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3)
    )
    assert default_blocks(model) == ["0", "3"]


def test_default_blocks_skip_small_repeated_pieces():
    """A pair of one class that holds a sliver of the parameters does not make the blocks."""
    model = nn.Sequential(
        nn.Sequential(conv_act(3, 4), conv_act(4, 4)),
        nn.Conv2d(4, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.Conv2d(64, 64, 3, padding=1),
    )
    assert default_blocks(model) == ["0", "1", "2", "3"]


def test_attention_called_with_one_tensor_three_times_plans_and_trains_bit_identically():
    """`nn.TransformerEncoderLayer` calls its `self_attn(x, x, x)`; `nn.MultiheadAttention`
    takes its fused path only when query, key and value are one tensor, so a region recorded
    alone on three copies would record another op stream than the step runs."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    net = nn.Sequential(layer, copy.deepcopy(layer)).train()
    x = torch.randn(2, 8, 32)
    least = executor.checkpoint_plan(
        net, (x,), "min", regions="children", time_limit=60, loss_fn=sum_loss
    )
    assert any(".self_attn" in name for name in least.checkpointed_regions())
    runs = [copy.deepcopy(net), least.apply(copy.deepcopy(net))]
    assert_same_adamw_steps(runs, lambda model, step: model(x).sum())


def test_a_plan_prints_as_one_short_line():
    """`repr(plan)` says what the plan does, not every op of every region."""
    torch.manual_seed(0)
    net = nn.Sequential(
        *(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True) for _ in range(2))
    )
    plan = executor.checkpoint_plan(
        net.train(), (torch.randn(2, 8, 32),), "100%", time_limit=60, loss_fn=sum_loss
    )
    text = repr(plan)
    assert "\n" not in text and len(text) < 240, text
    assert text.startswith(f"CheckpointPlan({plan.status}, ") and f"{plan.peak:,} B" in text
