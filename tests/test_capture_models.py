"""Capture of small models: DAG contract, bit-exact plain replay, bytes and FLOPs accounting."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from capture_checks import assert_exact_replay
from hypothesis import given, settings
from hypothesis import strategies as st
from saved_bytes import (
    eager_saved_bytes,
    expected_graph_saved_bytes,
    graph_saved_bytes,
)
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graph_capture import CapturedGraph, capture, eager_reference
from graph_capture.measurement.measure import is_random
from graph_capture.models.demo_models import Block, TinyUNet
from graph_capture.trace.lifted import LiftedConstant
from solver import prepare

pytestmark = pytest.mark.usefixtures("one_thread")  # exactness holds at one thread


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block(width=16, heads=2, dropout=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).pow(2).mean()


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.fc = nn.Linear(8 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


class UNetLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unet = TinyUNet(channels=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unet(x, torch.zeros(x.shape[0], 1, *x.shape[2:]))


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.left = nn.Linear(8, 2)
        self.right = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.trunk(x))
        return self.left(h), self.right(h).sum()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.hidden = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(self.embed(idx))))


def _models() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return {
        "mlp": (MLP(), (torch.randn(6, 16, requires_grad=True),)),
        "transformer": (TransformerBlock(), (torch.randn(2, 8, 16),)),
        "cnn": (CNN(), (torch.randn(4, 3, 8, 8),)),
        "unet": (UNetLoss(), (torch.randn(2, 3, 16, 16),)),
        "two_outputs": (TwoOutputs(), (torch.randn(5, 8, requires_grad=True),)),
        "tied": (Tied(), (torch.randint(0, 10, (3, 7)),)),
    }


MODELS = _models()


@pytest.fixture(scope="module", params=sorted(MODELS))
def captured(request) -> tuple[str, nn.Module, tuple, CapturedGraph]:
    model, inputs = MODELS[request.param]
    return request.param, model, inputs, capture(model, inputs, repeats=1)


def test_dag_meets_solver_contract(captured) -> None:
    _, _, _, graph = captured
    dag = graph.dag
    assert nx.is_directed_acyclic_graph(dag)
    order = dag.graph["order"]
    assert sorted(order) == sorted(dag.nodes)
    position = {v: i for i, v in enumerate(order)}
    assert all(position[u] < position[v] for u, v in dag.edges)
    phases = [dag.nodes[v]["backward"] for v in order]
    assert phases == sorted(phases), "every forward node comes before every backward node"
    for v, attrs in dag.nodes(data=True):
        assert isinstance(attrs["mem"], int) and attrs["mem"] >= 0
        assert attrs["cost"] >= 0 and attrs["flops"] >= 0
        assert attrs["phase"] in ("forward", "backward")
        assert v in graph.members[v]


def test_members_partition_the_joint_graph(captured) -> None:
    _, _, _, graph = captured
    computing = [n.name for n in graph.joint.graph.nodes if n.op == "call_function"]
    flat = [m for v in graph.order for m in graph.members[v]]
    assert sorted(flat) == sorted(computing)


def test_every_data_dependency_is_an_edge(captured) -> None:
    _, _, _, graph = captured
    group = {m: v for v, ms in graph.members.items() for m in ms}
    for node in graph.joint.graph.nodes:
        if node.op != "call_function":
            continue
        for source in node.all_input_nodes:
            if source.op == "call_function" and group[source.name] != group[node.name]:
                assert graph.dag.has_edge(group[source.name], group[node.name])


def test_no_forward_node_reads_a_tangent(captured) -> None:
    _, _, _, graph = captured
    nodes = {n.name: n for n in graph.joint.graph.nodes}
    tangents = set(graph.tangent_placeholders)
    for v in graph.order[: graph.first_backward_index]:
        for member in graph.members[v]:
            assert not {a.name for a in nodes[member].all_input_nodes} & tangents, member


def test_node_counts_are_sane(captured) -> None:
    _, _, _, graph = captured
    forward = sum(1 for v in graph.order if not graph.dag.nodes[v]["backward"])
    assert 2 <= forward < len(graph.order) <= len(graph.members)
    assert len(graph.order) < len(list(graph.joint.graph.nodes))


def test_plain_replay_is_bit_identical_to_eager(captured) -> None:
    _, model, inputs, graph = captured
    assert_exact_replay(model, inputs, graph)


def test_flops_match_flop_counter_totals(captured) -> None:
    _, model, inputs, graph = captured
    with FlopCounterMode(display=False) as counter:
        eager_reference(model, inputs, graph.default_tangents(), graph.tangent_output_indices)
    counted = sum(graph.dag.nodes[v]["flops_counted"] for v in graph.dag)
    assert counted == counter.get_total_flops()
    assert sum(graph.dag.nodes[v]["flops"] for v in graph.dag) >= counted


def test_saved_bytes_match_saved_tensors_hooks(captured) -> None:
    _, model, inputs, graph = captured
    eager = eager_saved_bytes(model, inputs)
    assert graph_saved_bytes(graph) == expected_graph_saved_bytes(graph, model, inputs, eager)


def test_module_granularity_keeps_totals(captured) -> None:
    _, model, inputs, op_graph = captured
    graph = capture(model, inputs, granularity="module", repeats=1)
    assert len(graph.order) <= len(op_graph.order)
    for attr in ("flops", "flops_counted"):
        assert sum(graph.dag.nodes[v][attr] for v in graph.dag) == sum(
            op_graph.dag.nodes[v][attr] for v in op_graph.dag
        )
    # Module groups hold each storage once; op level counts a split saved output twice.
    total = sum(graph.dag.nodes[v]["mem"] + graph.dag.nodes[v]["temp_mem"] for v in graph.dag)
    op_total = sum(
        op_graph.dag.nodes[v]["mem"] + op_graph.dag.nodes[v]["temp_mem"] for v in op_graph.dag
    )
    assert 0.95 * op_total <= total <= op_total
    assert nx.is_directed_acyclic_graph(graph.dag)
    assert_exact_replay(model, inputs, graph)


def test_capture_leaves_model_and_rng_untouched() -> None:
    model, inputs = MLP(), (torch.randn(3, 16),)
    model.net.append(nn.BatchNorm1d(4))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    capture(model, inputs, repeats=1)
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_cost_model_flops_uses_flops_as_cost() -> None:
    model, inputs = MODELS["two_outputs"]
    graph = capture(model, inputs, cost_model="flops", repeats=1)
    assert all(graph.dag.nodes[v]["cost"] == graph.dag.nodes[v]["flops"] for v in graph.dag)
    assert "step_cost" not in graph.dag.graph  # a step's seconds are not FLOPs


def test_step_cost_is_a_whole_pass_so_at_least_the_sum_of_the_op_costs() -> None:
    model, inputs = MODELS["mlp"]
    graph = capture(model, inputs, repeats=3)
    problem = prepare(graph.dag)
    # Each op's cost is its least over the passes and a pass holds every op's run, so the least
    # pass is at least the sum of the least op times (the gradient adds counted in both).
    assert problem.step_cost is not None
    assert problem.step_cost >= problem.total_cost * (1 - 1e-12)
    assert "step_cost" not in capture(model, inputs, repeats=1).dag.graph  # no timed pass


def test_dropout_is_marked_random() -> None:
    model, inputs = MODELS["mlp"]
    graph = capture(model, inputs, repeats=1)
    random = [v for v in graph.dag if graph.dag.nodes[v]["random"]]
    assert random and all(graph.dag.nodes[v]["module"] == "net.3" for v in random)
    assert any("dropout" in name for name in graph.random_nodes)


LAYERS = st.sampled_from(["linear", "relu", "gelu", "tanh", "layernorm", "dropout", "residual"])


def _stack(kinds: list[str], width: int) -> nn.Module:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.inner(x)

    make = {
        "linear": lambda: nn.Linear(width, width),
        "relu": nn.ReLU,
        "gelu": nn.GELU,
        "tanh": nn.Tanh,
        "layernorm": lambda: nn.LayerNorm(width),
        "dropout": lambda: nn.Dropout(0.3),
        "residual": Residual,
    }
    return nn.Sequential(nn.Linear(width, width), *(make[k]() for k in kinds))


@settings(max_examples=12)
@given(kinds=st.lists(LAYERS, min_size=1, max_size=6), width=st.integers(2, 9))
def test_random_stacks_replay_bit_identical(kinds: list[str], width: int) -> None:
    torch.manual_seed(0)
    model = _stack(kinds, width)
    inputs = (torch.randn(3, width, requires_grad=True),)
    graph = capture(model, inputs, repeats=1)
    assert nx.is_directed_acyclic_graph(graph.dag)
    assert_exact_replay(model, inputs, graph)


CONV_LAYERS = st.sampled_from(["conv", "batchnorm", "relu", "dropout2d", "avgpool_up", "skip"])


def _conv_stack(kinds: list[str], channels: int) -> nn.Module:
    class Skip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, self.conv(x)], dim=1)[:, :channels] + x

    class PoolUp(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.interpolate(nn.functional.avg_pool2d(x, 2), scale_factor=2)

    make = {
        "conv": lambda: nn.Conv2d(channels, channels, 3, padding=1),
        "batchnorm": lambda: nn.BatchNorm2d(channels),
        "relu": nn.ReLU,
        "dropout2d": lambda: nn.Dropout2d(0.3),
        "avgpool_up": PoolUp,
        "skip": Skip,
    }
    return nn.Sequential(nn.Conv2d(2, channels, 3, padding=1), *(make[k]() for k in kinds))


@settings(max_examples=10)
@given(kinds=st.lists(CONV_LAYERS, min_size=1, max_size=5), channels=st.integers(1, 4))
def test_random_conv_stacks_replay_bit_identical(kinds: list[str], channels: int) -> None:
    torch.manual_seed(0)
    model = _conv_stack(kinds, channels)
    inputs = (torch.randn(2, 2, 8, 8),)
    graph = capture(model, inputs, repeats=1)
    assert nx.is_directed_acyclic_graph(graph.dag)
    assert_exact_replay(model, inputs, graph)


class TransposedBatchNorm(nn.Module):
    """BatchNorm1d over features of a (batch, time, features) tensor: eager CPU kernels return
    strides the traced meta kernels did not predict, which a traced `view` cannot take."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x).transpose(1, 2)).transpose(1, 2).square().sum()


def test_batchnorm_on_a_transposed_input_replays_bit_identical() -> None:
    torch.manual_seed(0)
    model, inputs = TransposedBatchNorm(), (torch.randn(2, 5, 8),)
    assert_exact_replay(model, inputs, capture(model, inputs, repeats=1))


class PythonConstant(nn.Module):
    """Builds a tensor from Python data in forward: torch.export lifts it as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_lifted_constant_is_static_memory_and_replays_bit_identical() -> None:
    model, x = PythonConstant().train(), torch.randn(3, 4)
    graph = capture(model, (x,), repeats=1)
    constants = [n for n in graph.joint.graph.nodes if isinstance(n.target, LiftedConstant)]
    assert constants and graph.static_bytes["constants"] == 16
    (group,) = {graph.node_group[n.name] for n in constants}  # folded into its reader, a copy
    assert graph.dag.nodes[group]["mem"] == 16, "the constant itself counted as an activation"
    assert_exact_replay(model, (x,), graph)


def test_keyword_inputs_follow_the_positional_ones() -> None:
    model, x, y = nn.Bilinear(4, 3, 2).train(), torch.randn(5, 4), torch.randn(5, 3)
    graph = capture(model, (x,), example_kwargs={"input2": y}, repeats=1)
    assert graph.kwarg_names == ("input2",) and len(graph.input_placeholders) == 2
    torch.manual_seed(0)
    result = graph.run_plain(model, [x], graph.default_tangents(), {"input2": y})
    outputs, grads, _ = eager_reference(
        model, [x], graph.default_tangents(), graph.tangent_output_indices, {"input2": y}
    )
    assert torch.equal(result.outputs[0], outputs[0])
    assert all(torch.equal(result.param_grads[n], g) for n, g in grads.items())


def test_an_attention_kernel_without_dropout_draws_nothing() -> None:
    """The attention kernels carry the nondeterministic_seeded tag for their dropout: with
    ``dropout_p`` 0 (given or by default) they draw nothing and may be recomputed."""
    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    without = graph.call_function(flash, (q, q, q, 0.0))
    default = graph.call_function(flash, (q, q, q))
    dropping = graph.call_function(flash, (q, q, q), {"dropout_p": 0.1})
    dropout = graph.call_function(torch.ops.aten.native_dropout.default, (q, 0.1, True))
    assert not is_random(without) and not is_random(default)
    assert is_random(dropping) and is_random(dropout)
