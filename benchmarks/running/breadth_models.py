"""The architectures of `benchmarks.running.breadth`: third-party models (HuggingFace transformers
and
torchvision) at small configs, random init, nothing downloaded, in training mode with their
default dropout.

Each factory returns a `Case`: ``model(*inputs, **kwargs)`` is the training call and
``loss_fn(output)`` its scalar loss. HuggingFace models are built from configs with their
default settings (``use_cache`` left as it is) and called with ``labels=``; torchvision
classifiers are wrapped in `Classify`, whose forward returns the cross-entropy against the
``labels=`` it is given.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import os
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from graph_capture.models import hf_models

BATCH = 2
SEQ = 16
VOCAB = hf_models.VOCAB
CLASSES = 10


class Case(NamedTuple):
    """One architecture's training call: ``loss_fn(model(*inputs, **kwargs))`` is the loss."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    kwargs: dict[str, torch.Tensor]
    loss_fn: Callable[[object], torch.Tensor]


class TorchvisionMissing(RuntimeError):
    """torchvision is not installed: its rows are skipped."""


def hf_loss(output: object) -> torch.Tensor:
    """The loss of a HuggingFace model called with ``labels=``."""
    return output.loss


def tensor_loss(output: torch.Tensor) -> torch.Tensor:
    """The loss of a model whose output is the loss."""
    return output


class Classify(nn.Module):
    """A classifier whose forward returns the mean cross-entropy of its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(images), labels)


_TORCHVISION_OPS: list[object] = []  # keeps the op schemas defined below registered


@functools.cache
def torchvision():
    """torchvision, imported beside a CPU torch whose build its C extension does not match:
    where loading the extension fails, its two op schemas that importing it registers fakes for
    (``nms``, ``qnms``) are defined first. Also needed before transformers imports its image
    models, which import torchvision where it is installed. Raises `TorchvisionMissing`."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise TorchvisionMissing("torchvision not installed")
    if not hasattr(torch.ops.torchvision, "nms"):
        libraries = glob.glob(os.path.join(spec.submodule_search_locations[0], "_C*.so"))
        try:
            torch.ops.load_library(libraries[0])
        except (OSError, IndexError, RuntimeError):
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _TORCHVISION_OPS.append(lib)
    import torchvision as tv

    return tv


def _transformers():
    with contextlib.suppress(TorchvisionMissing):  # transformers imports it where installed
        torchvision()
    import transformers

    return transformers


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _images(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, 3, size, size, generator=gen), torch.arange(BATCH) % CLASSES


def _causal(cls: str, config: str, **settings: object) -> Case:
    t = _transformers()
    model = getattr(t, cls)(getattr(t, config)(vocab_size=VOCAB, **settings)).train()
    ids = _tokens()
    return Case(model, (ids,), {"labels": ids}, hf_loss)


def _decoder(cls: str, config: str, **settings: object) -> Case:
    """A Llama-like decoder: 2 layers, width 32, 2 query heads over 1 key/value head."""
    return _causal(
        cls,
        config,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
        **settings,
    )


def _masked(cls: str, config: str, **settings: object) -> Case:
    """A masked-LM encoder with an attention mask (padding at the end of the first row)."""
    t = _transformers()
    model = getattr(t, cls)(getattr(t, config)(vocab_size=VOCAB, **settings)).train()
    ids = _tokens()
    masked = torch.rand(BATCH, SEQ, generator=torch.Generator().manual_seed(1)) < 0.15
    masked[:, 0] = True
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[0, -3:] = 0
    return Case(
        model, (ids.masked_fill(masked, 3),), {"attention_mask": mask, "labels": labels}, hf_loss
    )


def _hf_call(make: Callable[[], hf_models.ModelCall]) -> Case:
    _transformers()
    model, inputs, kwargs = make()
    return Case(model, inputs, kwargs, hf_loss)


def _gpt2() -> Case:
    """GPT-2 with its loss named: ``GPT2LMHeadModel``'s class name names none, so transformers
    logs a warning on each call before using ``ForCausalLM``'s, and under torch.compile that
    logging call is a graph break; named, the loss is the same and nothing is logged."""
    case = _hf_call(hf_models.gpt2_lm)
    case.model.loss_type = "ForCausalLM"
    return case


def _hf_image(cls: str, config: Callable[[object], object]) -> Case:
    t = _transformers()
    pixels, labels = _images(32)
    model = getattr(t, cls)(config(t)).train()
    return Case(model, (pixels,), {"labels": labels}, hf_loss)


def _vision(make: Callable[[object], nn.Module], size: int = 64) -> Case:
    images, labels = _images(size)
    return Case(
        Classify(make(torchvision().models)).train(), (images,), {"labels": labels}, tensor_loss
    )


def _swin(models, block: str | None = None) -> nn.Module:
    swin = models.swin_transformer
    extra = {}
    if block:
        extra = {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2}
    return swin.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=32,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=[4, 4],
        num_classes=CLASSES,
        **extra,
    )


def _efficientnet(models) -> nn.Module:
    settings, last = models.efficientnet._efficientnet_conf(
        "efficientnet_b0", width_mult=0.5, depth_mult=0.34
    )
    return models.EfficientNet(settings, dropout=0.2, last_channel=last, num_classes=CLASSES)


def _convnext(models) -> nn.Module:
    block = models.convnext.CNBlockConfig
    stages = [block(16, 32, 2), block(32, None, 2)]
    return models.ConvNeXt(stages, stochastic_depth_prob=0.1, num_classes=CLASSES)


def _regnet(models) -> nn.Module:
    params = models.regnet.BlockParams.from_init_params(
        depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8
    )
    return models.RegNet(params, num_classes=CLASSES)


def _clip_config(t):
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    return t.CLIPConfig(vision_config=vision, text_config=text, num_labels=CLASSES)


def _swinv2_config(t):
    return t.Swinv2Config(
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 2],
        window_size=4,
        num_labels=CLASSES,
    )


HF: dict[str, Callable[[], Case]] = {
    "gpt2": _gpt2,
    "llama": lambda: _hf_call(hf_models.llama_lm),
    "mistral": lambda: _decoder("MistralForCausalLM", "MistralConfig"),
    "qwen2": lambda: _decoder("Qwen2ForCausalLM", "Qwen2Config"),
    "qwen3": lambda: _decoder("Qwen3ForCausalLM", "Qwen3Config", head_dim=16),
    "gemma": lambda: _decoder("GemmaForCausalLM", "GemmaConfig", head_dim=16),
    "gemma2": lambda: _decoder("Gemma2ForCausalLM", "Gemma2Config", head_dim=16),
    "phi": lambda: _decoder("PhiForCausalLM", "PhiConfig"),
    "gpt_neox": lambda: _causal(
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    "opt": lambda: _causal(
        "OPTForCausalLM",
        "OPTConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=64,
        word_embed_proj_dim=32,
        max_position_embeddings=64,
    ),
    "bloom": lambda: _causal(
        "BloomForCausalLM", "BloomConfig", hidden_size=32, n_layer=2, n_head=2
    ),
    "falcon": lambda: _causal(
        "FalconForCausalLM",
        "FalconConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
    ),
    "bert": lambda: _hf_call(hf_models.bert_mlm),
    "roberta": lambda: _masked(
        "RobertaForMaskedLM",
        "RobertaConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ + 2,
    ),
    "distilbert": lambda: _masked(
        "DistilBertForMaskedLM", "DistilBertConfig", dim=32, n_layers=2, n_heads=2, hidden_dim=64
    ),
    "t5": lambda: _hf_call(hf_models.t5_lm),
    "vit": lambda: _hf_call(hf_models.vit_classifier),
    "clip_vision": lambda: _hf_image("CLIPForImageClassification", _clip_config),
    "swinv2": lambda: _hf_image("Swinv2ForImageClassification", _swinv2_config),
}

TORCHVISION: dict[str, Callable[[], Case]] = {
    "tv_resnet18": lambda: _vision(lambda m: m.resnet18(num_classes=CLASSES)),
    "tv_resnet50": lambda: _vision(lambda m: m.resnet50(num_classes=CLASSES), size=32),
    "tv_mobilenet_v3_small": lambda: _vision(lambda m: m.mobilenet_v3_small(num_classes=CLASSES)),
    "tv_mobilenet_v2": lambda: _vision(
        lambda m: m.MobileNetV2(num_classes=CLASSES, width_mult=0.5)
    ),
    "tv_efficientnet_b0": lambda: _vision(_efficientnet, size=32),
    "tv_convnext": lambda: _vision(_convnext, size=32),
    "tv_vit": lambda: _vision(
        lambda m: m.VisionTransformer(
            image_size=64,
            patch_size=8,
            num_layers=4,
            num_heads=4,
            hidden_dim=128,
            mlp_dim=256,
            dropout=0.1,
            num_classes=CLASSES,
        )
    ),
    "tv_swin": lambda: _vision(_swin, size=32),
    "tv_swin_v2": lambda: _vision(lambda m: _swin(m, block="v2"), size=32),
    "tv_densenet": lambda: _vision(
        lambda m: m.DenseNet(
            growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=CLASSES
        ),
        size=32,
    ),
    "tv_regnet": lambda: _vision(_regnet, size=32),
    "tv_shufflenet_v2": lambda: _vision(
        lambda m: m.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=CLASSES), size=32
    ),
    "tv_squeezenet": lambda: _vision(lambda m: m.SqueezeNet("1_1", num_classes=CLASSES)),
    "tv_googlenet": lambda: _vision(
        lambda m: m.GoogLeNet(num_classes=CLASSES, aux_logits=False, init_weights=True)
    ),
    "tv_mnasnet": lambda: _vision(lambda m: m.MNASNet(0.5, num_classes=CLASSES), size=32),
}

ARCHITECTURES: dict[str, tuple[str, Callable[[], Case]]] = {
    **{name: ("hf", make) for name, make in HF.items()},
    **{name: ("torchvision", make) for name, make in TORCHVISION.items()},
}
"""Every architecture: name -> (family, factory)."""
