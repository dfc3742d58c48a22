"""The model zoo at tiny sizes: each factory builds a train-mode model whose forward returns a
scalar loss, forward+backward runs, `blocks` are the model's repeated blocks in execution order
and checkpointing each of them leaves the gradients bit-identical, CNNs capture at op level and
replay bit-identically, and `capture_graphs` writes loadable graph files and a manifest."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from functools import partial

import pytest
import torch
from capture_checks import assert_exact_replay
from torch import nn

from benchmarks.running import capture_graphs
from benchmarks.running.measure import checkpointed_blocks
from benchmarks.zoo import ZOO, Bench, mobilenet_v3_small, resnet18, resnet50
from benchmarks.zoo.mobilenet import InvertedResidual
from benchmarks.zoo.resnet import BasicBlock, Bottleneck
from cli.profile import load_model_from_args
from graph_capture import capture
from solver.io import load_graph

pytestmark = pytest.mark.usefixtures("one_thread")  # exactness holds at one thread

TINY_CNNS: dict[str, tuple[Callable[[], Bench], type[nn.Module]]] = {
    "resnet18": (partial(resnet18, batch=2, image=32, width=4), BasicBlock),
    "resnet50": (partial(resnet50, batch=2, image=32, width=4), Bottleneck),
    "mobilenet_v3_small": (
        partial(mobilenet_v3_small, batch=2, image=32, width_mult=0.25),
        InvertedResidual,
    ),
}


def _executed_blocks(bench: Bench) -> list[nn.Module]:
    """The modules of ``bench.blocks`` in the order a forward+backward calls them."""
    called: list[nn.Module] = []
    hooks = [b.register_forward_hook(lambda m, *_: called.append(m)) for b in bench.blocks]
    try:
        loss = bench.model(*bench.inputs)
        assert loss.dim() == 0 and torch.isfinite(loss)
        loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return called


def _assert_runs_with_blocks(bench: Bench, block_type: type[nn.Module]) -> None:
    assert bench.model.training
    repeated = [m for m in bench.model.modules() if isinstance(m, block_type)]
    assert bench.blocks == repeated, "blocks are every repeated block, in module order"
    assert _executed_blocks(bench) == repeated, "and in execution order"
    params = list(bench.model.parameters())
    assert params and all(p.grad is not None for p in params)


@pytest.mark.parametrize("name", sorted(TINY_CNNS))
def test_cnn_runs_and_blocks_are_its_repeated_blocks(name: str) -> None:
    factory, block_type = TINY_CNNS[name]
    _assert_runs_with_blocks(factory(), block_type)


def _gradients(bench: Bench, checkpointed: bool) -> list[torch.Tensor]:
    """Parameter gradients of one step from a fixed RNG seed, model state restored after."""
    state = {k: v.clone() for k, v in bench.model.state_dict().items()}
    bench.model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with checkpointed_blocks(bench.blocks) if checkpointed else contextlib.nullcontext():
        bench.model(*bench.inputs).backward()
    bench.model.load_state_dict(state)
    return [p.grad for p in bench.model.parameters()]


def _assert_blocks_checkpoint_exactly(bench: Bench) -> None:
    plain, checkpointed = _gradients(bench, False), _gradients(bench, True)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed, strict=True))


@pytest.mark.parametrize("name", sorted(TINY_CNNS))
def test_cnn_per_block_checkpoint_gives_bit_identical_gradients(name: str) -> None:
    _assert_blocks_checkpoint_exactly(TINY_CNNS[name][0]())


def test_cnn_block_counts_follow_torchvision() -> None:
    counts = {name: len(factory().blocks) for name, (factory, _) in TINY_CNNS.items()}
    assert counts == {"resnet18": 8, "resnet50": 16, "mobilenet_v3_small": 11}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_cnn_captures_at_op_level_and_replays_bit_identical(name: str) -> None:
    model, inputs = TINY_CNNS[name][0]()
    graph = capture(model, inputs, granularity="op", repeats=1)
    assert graph.dag.number_of_nodes() > 100
    assert_exact_replay(model, inputs, graph)


def test_zoo_names_are_cli_factories() -> None:
    args = argparse.Namespace(model="benchmarks.zoo:mobilenet_v3_small")
    model, inputs, kwargs = load_model_from_args(args)
    assert model.training and isinstance(inputs, tuple) and kwargs == {}
    assert model(*inputs).dim() == 0


def test_registry_names_fix_the_depth() -> None:
    for name, factory in ZOO.items():
        if "_" in name and name.rsplit("_", 1)[1].isdigit():
            assert factory.keywords == {"layers": int(name.rsplit("_", 1)[1])}
    assert {"resnet18", "resnet50", "mobilenet_v3_small", "gpt2_24", "vit_12"} <= set(ZOO)


def test_capture_graphs_writes_loadable_files_and_manifest(tmp_path) -> None:
    tiny = partial(resnet18, batch=2, image=16, width=2)
    entry = capture_graphs.capture_one("tiny", tiny, tmp_path, "op", measure=True)
    failed = capture_graphs.capture_one("broken", _broken, tmp_path, "op", measure=False)
    capture_graphs.write_manifest([entry, failed], tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())["graphs"]
    assert [e["name"] for e in manifest] == ["broken", "tiny"]
    assert manifest[0]["error"] == "RuntimeError: no model here"
    graph = load_graph(tmp_path / entry["file"])
    assert graph.number_of_nodes() == entry["nodes"] and graph.graph["name"] == "tiny"
    assert entry["checkpoint_all_peak_bytes"] > 0 and entry["eager_peak_bytes"] > 0


def _broken() -> Bench:
    raise RuntimeError("no model here")


HF_TINY = {"layers": 2, "hidden": 32, "heads": 2, "batch": 2}


def _tiny_transformers() -> dict[str, tuple[Callable[[], Bench], str]]:
    from benchmarks.zoo import bert, gpt2, llama, vit

    lm = {"seq": 8, "vocab": 64}
    return {
        "gpt2": (partial(gpt2, **HF_TINY, **lm), "GPT2Block"),
        "llama": (partial(llama, **HF_TINY, **lm, kv_heads=1), "LlamaDecoderLayer"),
        "bert": (partial(bert, **HF_TINY, **lm), "BertLayer"),
        "vit": (partial(vit, **HF_TINY, image=16, patch=8), "ViTLayer"),
    }


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit"])
def test_transformer_runs_with_dropout_and_blocks(name: str) -> None:
    pytest.importorskip("transformers")
    factory, block_class = _tiny_transformers()[name]
    bench = factory()
    block_type = type(bench.blocks[0])
    assert block_type.__name__ == block_class and len(bench.blocks) == HF_TINY["layers"]
    _assert_runs_with_blocks(bench, block_type)
    if name in ("gpt2", "llama"):
        assert bench.model.model.config.use_cache is False, "capture needs use_cache=False"
    losses = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        losses.append(bench.model(*bench.inputs))
    assert not torch.equal(*losses), "dropout runs: the loss depends on the RNG"
    _assert_blocks_checkpoint_exactly(bench)
