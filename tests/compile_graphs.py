"""The joint graph AOTAutograd hands a partitioner, for tests of executor.compile's DAG and
emitted graphs that need no kernels compiled."""

from __future__ import annotations

import torch
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.partitioners import default_partition
from torch._guards import detect_fake_mode
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.fx_passes.joint_graph import joint_graph_passes
from torch._inductor.virtualized import V


def joint_graph(model: nn.Module, x: torch.Tensor, inductor: bool = False) -> torch.fx.GraphModule:
    """The joint graph AOTAutograd hands a partitioner for ``model``'s step on ``x``;
    ``inductor``: traced with inductor's decompositions and rewritten by its joint passes,
    as inductor hands it (no kernels compiled)."""
    graphs = []

    def partition(gm, joint_inputs, **kwargs):
        if inductor:
            with V.set_fake_mode(detect_fake_mode(joint_inputs)):
                joint_graph_passes(gm)
        graphs.append(gm)
        return default_partition(gm, joint_inputs, **kwargs)

    decompositions = select_decomp_table() if inductor else None
    backend = aot_autograd(
        fw_compiler=boxed_nop,
        bw_compiler=boxed_nop,
        partition_fn=partition,
        decompositions=decompositions,
    )
    torch.compile(model, backend=backend, fullgraph=True)(x).square().mean().backward()
    return graphs[0]


def remat_graphs(model: nn.Module, args: tuple, partitioner) -> None:
    """One step of ``model`` on ``args`` (loss: the output's sum of squares' mean) with
    ``partitioner`` (a `RematPartitioner`) partitioning the joint graph inductor would hand
    it (its decompositions and joint passes), the graphs then run as they are: what inductor
    would compile, without compiling it. The graphs are in ``partitioner.regions``."""

    def partition(gm, joint_inputs, **kwargs):
        with V.set_fake_mode(detect_fake_mode(joint_inputs)):
            joint_graph_passes(gm)
        return partitioner(gm, joint_inputs, **kwargs)

    backend = aot_autograd(
        fw_compiler=boxed_nop,
        bw_compiler=boxed_nop,
        partition_fn=partition,
        decompositions=select_decomp_table(),
    )
    out = torch.compile(model, backend=backend, fullgraph=True)(*args)
    out.square().mean().backward()
