"""ResNet-18 and ResNet-50 written the way torchvision writes them (`torchvision.models.resnet`):
`BasicBlock` / `Bottleneck` with `conv3x3` / `conv1x1` helpers, BatchNorm, in-place ReLU, a
`downsample` Sequential on the shortcut, the 7x7 stem with max-pool, adaptive average pooling
and a linear head; torchvision's layer counts and initialisation. torchvision itself is not a
dependency (its registry build needs CUDA torch)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from benchmarks.zoo.bench import Bench, ClassifierLoss, image_batch


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding, no bias (BatchNorm follows)."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution, no bias."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and the identity (or `downsample`d) shortcut."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, as torchvision's ResNet V1.5), 1x1 expand by 4."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    """torchvision's ResNet; ``width`` is the first stage's planes (torchvision: 64), the four
    stages have ``width * (1, 2, 4, 8)`` planes."""

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        layers: list[int],
        num_classes: int = 1000,
        width: int = 64,
    ) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = x.flatten(1)
        return self.fc(x)


def _resnet(
    block: type[BasicBlock | Bottleneck],
    layers: list[int],
    batch: int,
    image: int,
    classes: int,
    width: int,
) -> Bench:
    torch.manual_seed(0)
    net = ResNet(block, layers, num_classes=classes, width=width)
    model = ClassifierLoss(net).train()
    blocks = [b for stage in (net.layer1, net.layer2, net.layer3, net.layer4) for b in stage]
    return Bench(model, image_batch(batch, image, classes), blocks)


def resnet18(batch: int = 8, image: int = 64, classes: int = 10, width: int = 64) -> Bench:
    """ResNet-18 (BasicBlock, layers 2-2-2-2), cross-entropy on fixed labels; blocks: the 8
    BasicBlocks. Default: batch 8 of 64x64 images, 10 classes, torchvision's widths."""
    return _resnet(BasicBlock, [2, 2, 2, 2], batch, image, classes, width)


def resnet50(batch: int = 8, image: int = 64, classes: int = 10, width: int = 64) -> Bench:
    """ResNet-50 (Bottleneck, layers 3-4-6-3), cross-entropy on fixed labels; blocks: the 16
    Bottlenecks. Default: batch 8 of 64x64 images, 10 classes, torchvision's widths."""
    return _resnet(Bottleneck, [3, 4, 6, 3], batch, image, classes, width)
