"""The model zoo: real network architectures built in the project, each a factory returning a
`Bench` (the model in train mode whose forward returns the scalar loss, its example inputs, and
the repeated blocks a user would wrap in per-block `torch.utils.checkpoint`).

- CNNs written the way torchvision writes them: `resnet18`, `resnet50`, `mobilenet_v3_small`.
- HuggingFace transformers from small configs (needs transformers): `gpt2`, `llama`, `bert`,
  `vit`, each with a ``layers`` parameter; the registry names ``gpt2_4``, ``gpt2_12``,
  ``gpt2_24`` (and likewise ``llama_*``, ``bert_*``, ``vit_*``) fix the depth.

Every factory has CPU-friendly defaults (about a second per training step at most, one thread)
and size parameters. `ZOO` maps every name to its factory; each name is also an attribute of
this module, so a zoo model is a CLI factory: ``remat profile --model benchmarks.zoo:resnet18``
(a `Bench` unpacks as ``(model, example_inputs)``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from benchmarks.zoo.bench import Bench
from benchmarks.zoo.hf import bert, gpt2, llama, vit
from benchmarks.zoo.mobilenet import mobilenet_v3_small
from benchmarks.zoo.resnet import resnet18, resnet50

HF_DEPTHS = (4, 12, 24)
"""The ``layers`` of the registry's transformer entries."""

CNNS: dict[str, Callable[[], Bench]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v3_small": mobilenet_v3_small,
}
TRANSFORMERS: dict[str, Callable[[], Bench]] = {
    f"{name}_{layers}": partial(factory, layers=layers)
    for name, factory in (("gpt2", gpt2), ("llama", llama), ("bert", bert), ("vit", vit))
    for layers in HF_DEPTHS
}
ZOO: dict[str, Callable[[], Bench]] = {**CNNS, **TRANSFORMERS}
"""Every zoo model by name; the transformer entries need transformers installed."""


def __getattr__(name: str) -> Callable[[], Bench]:
    """``benchmarks.zoo.gpt2_12`` and the like: the registry's fixed-depth entries."""
    if name in TRANSFORMERS:
        return TRANSFORMERS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CNNS",
    "TRANSFORMERS",
    "ZOO",
    "Bench",
    "bert",
    "gpt2",
    "llama",
    "mobilenet_v3_small",
    "resnet18",
    "resnet50",
    "vit",
]
