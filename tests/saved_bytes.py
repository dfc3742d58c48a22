"""Cross-checks of a capture's bytes against what eager autograd really saves (the capture tests'
helper; docs/capture.md, "Bytes: graph vs `saved_tensors_hooks`").

`eager_saved_bytes` counts the tensors autograd saves for backward during an eager forward
(``torch.autograd.graph.saved_tensors_hooks``), storage-deduplicated and excluding parameters,
buffers and inputs. `graph_saved_bytes` is the same quantity on the captured DAG: the ``mem``
of forward nodes some backward node reads (what checkpoint-all keeps). They differ by exactly
two known amounts, which `expected_graph_saved_bytes` applies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from graph_capture.captured import CapturedGraph


def eager_saved_bytes(model: nn.Module, inputs: Sequence[torch.Tensor]) -> int:
    """Bytes eager autograd saves for backward in ``model(*inputs)`` (runs the forward once)."""
    static = {
        t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), *inputs]
    }
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in static:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return sum(saved.values())


def graph_saved_bytes(graph: CapturedGraph) -> int:
    """Bytes of the forward DAG nodes that some backward node reads."""
    dag = graph.dag
    return sum(
        dag.nodes[v]["mem"]
        for v in dag
        if not dag.nodes[v]["backward"] and any(dag.nodes[s]["backward"] for s in dag.successors(v))
    )


def expected_graph_saved_bytes(
    graph: CapturedGraph, model: nn.Module, inputs: Sequence[torch.Tensor], eager_bytes: int
) -> int:
    """``eager_bytes`` corrected for the two ways the traced graph saves differently.

    The traced ``native_dropout`` keeps a bool mask where eager CPU dropout keeps a float32 one
    (3 bytes less per element); BatchNorm's backward reads the new running statistics, fresh
    tensors in the functional graph where eager saves the (static) buffers themselves.
    """
    result = graph.run_plain(model, inputs, graph.default_tangents())
    mask_elements = sum(
        node.meta["val"].numel()
        for node in graph.joint.graph.nodes
        if node.op == "call_function"
        and node.args
        and getattr(node.args[0], "target", None) is torch.ops.aten.native_dropout.default
        and node.args[1] == 1
    )
    running_stats = sum(
        value.nbytes for value in result.buffer_updates.values() if value.is_floating_point()
    )
    return eager_bytes - 3 * mask_elements + running_stats
