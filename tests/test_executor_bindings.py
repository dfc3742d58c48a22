"""torch's own bindings in generated code: used only where they make the node's exact call."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from executor.traced.bindings import binding_for, bindings
from graph_capture import capture

pytestmark = pytest.mark.usefixtures("one_thread")

aten = torch.ops.aten


def traced(fn, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """`fn` traced to aten ops, every node with its traced value in meta['val']."""
    return make_fx(fn, tracing_mode="fake")(*inputs)


def node_of(gm: torch.fx.GraphModule, target) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.target is target)


def test_a_binding_that_makes_the_same_call_is_used():
    gm = traced(lambda a, b: torch.mm(a, b).t(), torch.randn(3, 4), torch.randn(4, 5))
    assert binding_for(node_of(gm, aten.mm.default)) is torch._C._VariableFunctions.mm
    assert binding_for(node_of(gm, aten.t.default)) is torch._C._VariableFunctions.t


def test_a_binding_of_the_same_name_that_makes_another_call_is_not_used():
    # torch.mul(x, 2.0) dispatches aten.mul.Tensor, not the node's aten.mul.Scalar; Tensor.index
    # is not aten.index
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(3, 4, device="meta")
    scaled = graph.call_function(aten.mul.Scalar, (x, 2.0))
    rows = graph.placeholder("rows")
    rows.meta["val"] = torch.empty(2, dtype=torch.long, device="meta")
    picked = graph.call_function(aten.index.Tensor, (x, [rows]))
    assert binding_for(scaled) is None
    assert binding_for(picked) is None


def test_a_node_without_a_traced_value_keeps_its_overload():
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    assert binding_for(graph.call_function(aten.mm.default, (a, b))) is None


def test_every_binding_on_a_captured_model_computes_what_its_overload_does():
    """On a captured model, every bound node gives bit-identical outputs to its overload's on
    real inputs, at least half the nodes are bound, and `bindings` (which checks repeated calls
    once) agrees with `binding_for` node by node."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.GELU()
    ).train()
    x = torch.randn(8, 16)
    captured = capture(model, [x])
    calls = [n for n in captured.joint.graph.nodes if n.op == "call_function"]
    bound = bindings(calls)
    assert len(bound) >= len(calls) // 2
    assert all(bound[n] is binding_for(n) for n in bound)
    generator = torch.Generator().manual_seed(1)
    for node, binding in bound.items():
        args, kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda n: _real(n.meta["val"], generator)
        )
        expected = node.target._op(*args, **kwargs)
        got = binding(*args, **kwargs)
        assert type(got) is type(expected)
        for e, g in zip(_flat(expected), _flat(got), strict=True):
            assert torch.equal(e, g), node.format_node()


def _real(val: object, generator: torch.Generator) -> object:
    if not isinstance(val, torch.Tensor):
        return val
    if val.dtype.is_floating_point:
        return torch.randn(val.shape, generator=generator, dtype=val.dtype)
    return torch.zeros(val.shape, dtype=val.dtype)


def _flat(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]
