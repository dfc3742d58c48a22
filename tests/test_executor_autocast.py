"""Mixed precision: a graph captured under autocast trains bit-identically to eager under the
same autocast, and a step under another autocast state than the capture's is refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import solver
from executor import AutocastMismatchError, rematerialize
from graph_capture import capture
from graph_capture.measurement.device import AutocastState

pytestmark = pytest.mark.usefixtures("one_thread")


class Block(nn.Module):
    """Attention-like mixing, LayerNorm, dropout and an MLP: the ops autocast treats
    differently (matmuls in low precision, softmax and norms in float32). Dropout p = 0.1:
    its scale 1 / 0.9 is no bfloat16 number, so eager CPU dropout rounds it (see
    graph_capture.trace.dropout)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.norm, self.drop = nn.LayerNorm(width), nn.Dropout(0.1)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attention = self.drop((q @ k.transpose(-2, -1) / 8).softmax(-1))
        h = self.norm(x + self.out(attention @ v))
        return (h + self.drop(self.mlp(h))).float().square().mean()


def model_and_input(device: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Block().train().to(device), torch.randn(4, 16, 32).to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_training_under_autocast_is_bit_identical_to_eager_autocast(device, dtype):
    model, x = model_and_input(device)
    eager, remat_model = copy.deepcopy(model), copy.deepcopy(model)
    with torch.autocast(device, dtype=dtype):
        rm = rematerialize(remat_model, [x], midway(copy.deepcopy(model), x), time_limit=20)
    assert rm.captured.autocast == AutocastState(device, True, dtype)
    assert any(str(d).endswith(str(dtype).removeprefix("torch.")) for d in _dtypes(rm))
    assert len(rm.schedule.ops) > 2 * rm.captured.dag.number_of_nodes(), "no recomputation"
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, rm)]
    for step in range(3):
        losses = []
        for module, optimizer in zip((eager, rm), optimizers, strict=True):
            torch.manual_seed(step)
            with torch.autocast(device, dtype=dtype):
                loss = module(x)
            loss.backward()  # outside autocast, as torch's AMP recipe says
            losses.append(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        assert torch.equal(losses[0], losses[1]), f"step {step}: loss differs"
        for (name, a), b in zip(eager.named_parameters(), remat_model.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: {name} differs after the update"


def midway(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes midway between the least peak of the model's graph (captured under the autocast
    in force) and its checkpoint-all peak: a budget that makes the schedule recompute."""
    graph = capture(model, [x]).dag
    least = solver.solve(graph, objective="memory", time_limit=10).peak
    return (least + solver.checkpoint_all_peak(solver.prepare(graph))) // 2


def _dtypes(rm) -> set[str]:
    return {d for v in rm.captured.dag for d in rm.captured.dag.nodes[v]["dtypes"]}


def test_step_under_another_autocast_state_than_the_capture_is_refused(device):
    model, x = model_and_input(device)
    plain = rematerialize(copy.deepcopy(model), [x], "100%", time_limit=20)
    with (
        torch.autocast(device, dtype=torch.bfloat16),
        pytest.raises(
            AutocastMismatchError,
            match=rf"runs under torch.autocast\(\"{device}\", dtype=torch.bfloat16\), but the "
            rf"graph was captured under no autocast on {device}.*capture .*under the same",
        ),
    ):
        plain(x)
    with torch.autocast(device, dtype=torch.bfloat16):
        mixed = rematerialize(copy.deepcopy(model), [x], "100%", time_limit=20)
    with pytest.raises(AutocastMismatchError, match=rf"runs under no autocast on {device}"):
        mixed(x)
    with (
        torch.autocast(device, dtype=torch.float16),
        pytest.raises(AutocastMismatchError, match=r"float16.*captured under.*bfloat16"),
    ):
        mixed(x)
