"""executor.compile's model of inductor's fusion (`joint_dag.fuse_groups`, `inline_reads`): a
pointwise chain becomes one DAG node holding only the values read outside it, a backward
kernel computes the forward chains it reads again inside it, and graphs emitted from fused
and inlined nodes stay bit-identical to eager under aot_eager. Where the model misses, the
measured loop's steps grow until the budget holds."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from compile_graphs import joint_graph
from test_compile_partition import SOLVED, Net, assert_equal_steps, sgd_steps
from torch import nn

import executor
from executor.compiled import budget_loop
from executor.compiled.joint_dag import joint_dag
from executor.compiled.partitioner import RematPartitioner

pytestmark = pytest.mark.usefixtures("one_thread")


class TanhGelu(nn.Module):
    """GPT-2's GELU: eight pointwise ops, the backward reading ``x`` and the tanh."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


def _node_of(gm: torch.fx.GraphModule, joint, target, phase: str) -> str:
    """The DAG node of ``joint`` (``gm``'s) holding an fx node calling ``target`` in ``phase``."""
    nodes = {n.name: n for n in gm.graph.nodes}
    return next(
        v
        for v in joint.dag.graph["order"]
        if joint.dag.nodes[v]["phase"] == phase
        and any(nodes[m].target == target for m in joint.members[v])
    )


def test_a_gelu_chain_is_one_node_and_its_backward_recomputes_it_inside():
    """Inductor's joint graph of a tanh GELU between two linears: fused, the forward chain is
    one node holding only its output (what the next linear and its weight gradient read); the
    backward chain computes the forward's tanh and ``1 + tanh`` again inside its own kernel,
    so it reads the first linear's output, not the forward chain's values."""
    net = nn.Sequential(nn.Linear(16, 64), TanhGelu(), nn.Linear(64, 16))
    gm = joint_graph(net, torch.randn(8, 16), inductor=True)
    plain, fused = joint_dag(gm), joint_dag(gm, fuse=True)
    aten = torch.ops.aten
    value = 8 * 64 * 4  # bytes of one (8, 64) float32 value
    pow_node = _node_of(gm, plain, aten.pow.Tensor_Scalar, "forward")
    assert plain.dag.nodes[pow_node]["mem"] == value  # unfused: the cube is a value
    gelu = _node_of(gm, fused, aten.tanh.default, "forward")
    assert _node_of(gm, fused, aten.pow.Tensor_Scalar, "forward") == gelu
    assert len(fused.members[gelu]) >= 8  # pow, mul, add, mul, tanh, add, mul, mul: one kernel
    assert fused.dag.nodes[gelu]["mem"] == value and fused.dag.nodes[gelu]["transient"] == 0
    up = _node_of(gm, fused, aten.addmm.default, "forward")
    (chain,) = fused.inlined
    nodes = {n.name: n for n in gm.graph.nodes}
    assert aten.tanh.default in {nodes[m].target for m in fused.inlined[chain]}
    assert up in fused.dag.predecessors(chain) and gelu not in fused.dag.predecessors(chain)
    assert fused.dag.number_of_nodes() < plain.dag.number_of_nodes() * 0.6


class ClsTokenDropout(nn.Module):
    """ViT's embeddings: a class token concatenated before the patches, then dropout. The
    backward slices the dropout's gradient in two (the token's, the patches')."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.cls, self.proj = nn.Parameter(torch.randn(1, 1, d)), nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.cat([self.cls.expand(x.shape[0], -1, -1), self.proj(x)], 1))


def test_views_of_a_value_a_joint_pass_replaced_fold_into_its_node():
    """Inductor's random pass replaces the dropout's backward by new nodes with new fake
    values; the two slices of it keep values viewing the replaced one's storage. Each view
    holds its base's storage: both join the node of the gradient they slice."""
    gm = joint_graph(ClsTokenDropout(), torch.randn(2, 3, 8), inductor=True)
    joint = joint_dag(gm, fuse=True)
    nodes = {n.name: n for n in gm.graph.nodes}
    slices = [n for n in nodes.values() if n.target is torch.ops.aten.slice.Tensor]
    assert len(slices) == 2 and slices[0].args[0] is slices[1].args[0]
    base = slices[0].args[0]
    (node,) = [v for v, m in joint.members.items() if base.name in m]
    assert {s.name for s in slices} <= set(joint.members[node])
    assert joint.dag.nodes[node]["mem"] == 2 * 4 * 8 * 4  # the (2, 4, 8) float32 gradient


class GeluNet(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop, self.act, self.norm = nn.Dropout(0.2), TanhGelu(), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = x + self.drop(self.down(self.act(self.up(self.norm(x)))))
        return x.square().mean()


def test_fused_nodes_emit_graphs_bit_identical_to_eager(monkeypatch):
    class Fused(RematPartitioner):
        def __init__(self, budget, deadline, replay_rng, fuse=False, link=None):
            super().__init__(budget, deadline, replay_rng, fuse=True, link=link)

    monkeypatch.setattr(budget_loop, "RematPartitioner", Fused)
    torch.manual_seed(0)
    net, x = GeluNet().train(), torch.randn(64, 32)
    eager = copy.deepcopy(net)
    cm = executor.compile(net, (x,), "min", **SOLVED)
    (region,) = cm.remat.regions
    assert region.inlined, "the backward recomputes forward chains inside its kernels"
    assert region.partition.recomputes, "the least-peak plan recomputes fused nodes"
    assert max(len(m) for m in region.member_ops.values()) >= 5
    assert_equal_steps(sgd_steps(net, cm, x), sgd_steps(eager, eager, x))


def test_a_measured_peak_that_does_not_move_lowers_the_solver_budget_faster(monkeypatch):
    """The measured peak stays one step over the budget until the solver budget is five
    steps under the first schedule's predicted peak (inductor's peak moves in steps): each
    miss solves below the last predicted peak by the excess doubled, so at most four compiles
    reach it."""
    target, step = 4 * 2**20, 64  # far above the net's step (values of 2 KiB): any fits
    measure, first = budget_loop.CompiledSteps.measure, []

    def stuck(self, backend, partitioner):
        call, measured = measure(self, backend, partitioner)
        first.append(first[0] if first else partitioner.regions[0].schedule.peak)
        if partitioner.budget > first[0] - 5 * step:
            measured = dataclasses.replace(measured, peak=target + step)
        return call, measured

    monkeypatch.setattr(budget_loop.CompiledSteps, "measure", stuck)
    x = torch.randn(16, 32)
    cm = executor.compile(Net(layers=1), (x,), target, **SOLVED)
    tries = cm.remat.tries
    assert tries[1].solver_budget == tries[0].predicted - step < target
    for k, t in enumerate(tries[1:], start=1):
        assert t.solver_budget <= first[0] - (2**k - 1) * step
    assert len(tries) <= 4 and cm.remat.peak <= target
