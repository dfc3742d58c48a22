"""`Bench`: a model whose forward returns the scalar loss, its example inputs, and its blocks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F


class Bench(tuple):
    """The pair ``(model, inputs)`` with the model's checkpointable ``blocks`` beside it.

    - ``model``: in train mode; ``model(*inputs)`` returns the scalar training loss.
    - ``inputs``: the example inputs (a tuple of tensors, labels included).
    - ``blocks``: the repeated blocks a user would wrap one by one in
      `torch.utils.checkpoint`, in execution order (None when the model has no block list).

    A `Bench` unpacks as ``model, inputs = bench``: it is the ``(model, example_inputs)`` pair
    that ``--model MODULE:FACTORY`` expects, so every zoo factory is also a CLI factory.
    """

    blocks: list[nn.Module] | None

    def __new__(
        cls,
        model: nn.Module,
        inputs: Sequence[torch.Tensor],
        blocks: list[nn.Module] | None = None,
    ) -> Bench:
        bench = super().__new__(cls, (model, tuple(inputs)))
        bench.blocks = blocks
        return bench

    @property
    def model(self) -> nn.Module:
        """The model; its forward returns the scalar loss."""
        return self[0]

    @property
    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The example inputs of ``model``."""
        return self[1]


class ClassifierLoss(nn.Module):
    """``forward(images, labels)``: cross-entropy of ``classifier(images)`` against ``labels``."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.classifier(images), labels)


class HFLoss(nn.Module):
    """A HuggingFace model called as its users call it: ``forward(*tensors)`` passes the tensors
    as the keyword arguments ``keys`` (``labels`` among them) and returns ``.loss``."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.keys, tensors, strict=True))).loss


def image_batch(
    batch: int, image: int, classes: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed RGB images ``(batch, 3, image, image)`` and int64 labels below ``classes``."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return images, torch.randint(0, classes, (batch,), generator=generator)
