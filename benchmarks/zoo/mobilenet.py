"""MobileNetV3-small written the way torchvision writes it (`torchvision.models.mobilenetv3`,
`torchvision.ops.misc`): `Conv2dNormActivation`, `InvertedResidual` blocks with
`SqueezeExcitation` (ReLU, then hardsigmoid scale), hardswish, the small configuration's block
table, and a classifier with dropout; torchvision's BatchNorm settings and initialisation."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor, nn

from benchmarks.zoo.bench import Bench, ClassifierLoss, image_batch


def _make_divisible(v: float, divisor: int = 8) -> int:
    """The nearest multiple of ``divisor`` to ``v``, at least ``divisor``, never 10% below."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class Conv2dNormActivation(nn.Sequential):
    """Conv2d ("same" padding, bias only without a norm), norm layer, in-place activation."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
        norm_layer: Callable[[int], nn.Module] | None = nn.BatchNorm2d,
        activation_layer: Callable[..., nn.Module] | None = nn.ReLU,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                (kernel_size - 1) // 2,
                groups=groups,
                bias=norm_layer is None,
            )
        ]
        if norm_layer is not None:
            layers.append(norm_layer(out_channels))
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)
        self.out_channels = out_channels


class SqueezeExcitation(nn.Module):
    """Channel attention: ``input * scale_activation(fc2(activation(fc1(avgpool(input)))))``."""

    def __init__(
        self,
        input_channels: int,
        squeeze_channels: int,
        activation: Callable[[], nn.Module] = nn.ReLU,
        scale_activation: Callable[[], nn.Module] = nn.Sigmoid,
    ) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _scale(self, input: Tensor) -> Tensor:
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input: Tensor) -> Tensor:
        return self._scale(input) * input


class InvertedResidualConfig(NamedTuple):
    """One row of the block table (channels before the width multiplier)."""

    input_channels: int
    kernel: int
    expanded_channels: int
    out_channels: int
    use_se: bool
    activation: str  # "RE" (ReLU) or "HS" (hardswish)
    stride: int


class InvertedResidual(nn.Module):
    """1x1 expand (when it widens), depthwise kxk, squeeze-excite, 1x1 project; the input is
    added back when the stride is 1 and the channels match."""

    def __init__(self, cnf: InvertedResidualConfig, norm_layer: Callable[[int], nn.Module]):
        super().__init__()
        self.use_res_connect = cnf.stride == 1 and cnf.input_channels == cnf.out_channels
        activation_layer = nn.Hardswish if cnf.activation == "HS" else nn.ReLU
        layers: list[nn.Module] = []
        if cnf.expanded_channels != cnf.input_channels:
            layers.append(
                Conv2dNormActivation(
                    cnf.input_channels,
                    cnf.expanded_channels,
                    kernel_size=1,
                    norm_layer=norm_layer,
                    activation_layer=activation_layer,
                )
            )
        layers.append(
            Conv2dNormActivation(
                cnf.expanded_channels,
                cnf.expanded_channels,
                kernel_size=cnf.kernel,
                stride=cnf.stride,
                groups=cnf.expanded_channels,
                norm_layer=norm_layer,
                activation_layer=activation_layer,
            )
        )
        if cnf.use_se:
            squeeze_channels = _make_divisible(cnf.expanded_channels // 4)
            layers.append(
                SqueezeExcitation(
                    cnf.expanded_channels, squeeze_channels, scale_activation=nn.Hardsigmoid
                )
            )
        layers.append(
            Conv2dNormActivation(
                cnf.expanded_channels,
                cnf.out_channels,
                kernel_size=1,
                norm_layer=norm_layer,
                activation_layer=None,
            )
        )
        self.block = nn.Sequential(*layers)
        self.out_channels = cnf.out_channels

    def forward(self, input: Tensor) -> Tensor:
        result = self.block(input)
        if self.use_res_connect:
            result += input
        return result


SMALL_BLOCKS = (
    InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2),
    InvertedResidualConfig(16, 3, 72, 24, False, "RE", 2),
    InvertedResidualConfig(24, 3, 88, 24, False, "RE", 1),
    InvertedResidualConfig(24, 5, 96, 40, True, "HS", 2),
    InvertedResidualConfig(40, 5, 240, 40, True, "HS", 1),
    InvertedResidualConfig(40, 5, 240, 40, True, "HS", 1),
    InvertedResidualConfig(40, 5, 120, 48, True, "HS", 1),
    InvertedResidualConfig(48, 5, 144, 48, True, "HS", 1),
    InvertedResidualConfig(48, 5, 288, 96, True, "HS", 2),
    InvertedResidualConfig(96, 5, 576, 96, True, "HS", 1),
    InvertedResidualConfig(96, 5, 576, 96, True, "HS", 1),
)
"""torchvision's `mobilenet_v3_small` block table (dilation 1)."""


def _scaled(cnf: InvertedResidualConfig, width_mult: float) -> InvertedResidualConfig:
    return cnf._replace(
        input_channels=_make_divisible(cnf.input_channels * width_mult),
        expanded_channels=_make_divisible(cnf.expanded_channels * width_mult),
        out_channels=_make_divisible(cnf.out_channels * width_mult),
    )


class MobileNetV3(nn.Module):
    """Stem (3x3 stride 2, hardswish), the inverted residual blocks, a 1x1 conv to 6x the last
    block's channels, average pooling, and Linear-hardswish-dropout-Linear."""

    def __init__(
        self,
        setting: list[InvertedResidualConfig],
        last_channel: int,
        num_classes: int = 1000,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        norm_layer = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [
            Conv2dNormActivation(
                3,
                setting[0].input_channels,
                kernel_size=3,
                stride=2,
                norm_layer=norm_layer,
                activation_layer=nn.Hardswish,
            )
        ]
        layers += [InvertedResidual(cnf, norm_layer) for cnf in setting]
        lastconv_output_channels = 6 * setting[-1].out_channels
        layers.append(
            Conv2dNormActivation(
                setting[-1].out_channels,
                lastconv_output_channels,
                kernel_size=1,
                norm_layer=norm_layer,
                activation_layer=nn.Hardswish,
            )
        )
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(lastconv_output_channels, last_channel),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=dropout, inplace=True),
            nn.Linear(last_channel, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = x.flatten(1)
        return self.classifier(x)


def mobilenet_v3_small(
    batch: int = 8, image: int = 64, classes: int = 10, width_mult: float = 1.0
) -> Bench:
    """MobileNetV3-small, cross-entropy on fixed labels; blocks: the 11 InvertedResiduals.
    Default: batch 8 of 64x64 images, 10 classes, width multiplier 1 (torchvision's)."""
    torch.manual_seed(0)
    setting = [_scaled(cnf, width_mult) for cnf in SMALL_BLOCKS]
    net = MobileNetV3(setting, last_channel=_make_divisible(1024 * width_mult), num_classes=classes)
    blocks = [m for m in net.features if isinstance(m, InvertedResidual)]
    return Bench(ClassifierLoss(net).train(), image_batch(batch, image, classes), blocks)
