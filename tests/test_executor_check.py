"""The own executor hands over no module it has not checked (`executor.traced.module.
check_against_eager`): `rematerialize`, `Rematerialized.load` and `remat run` hold one step on
the example inputs against eager's from the same state, bit for bit (outputs, ``.grad``,
buffers), refuse a module whose traced graph computes otherwise with `RematerializeError`
naming the first differing value, and leave the model, its ``.grad`` and the generator as
found."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import solver
from cli.main import main
from executor.errors import RematerializeError
from executor.traced.module import Rematerialized
from executor.traced.rematerialize import rematerialize
from graph_capture import capture

pytestmark = pytest.mark.usefixtures("one_thread")


class ExportSumsOtherwise(nn.Module):
    """Sums three branches in one order eagerly and in another under export, as HF's mask
    code chooses another attention call where export hides the input values from it: the
    traced graph is eager's up to the last bits."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = (branch(x) for branch in self.branches)
        total = (a + b) + c if torch.compiler.is_exporting() else a + (b + c)
        return total.tanh()


def sums_otherwise() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A `--model` factory: (model, example_inputs)."""
    torch.manual_seed(0)
    return ExportSumsOtherwise(), (torch.randn(8, 16),)


def test_a_module_whose_traced_graph_differs_is_refused_by_every_way_in(tmp_path, capsys):
    model, x = sums_otherwise()
    differs = r"output 0 .*relative difference [0-9.e-]+, not bit for bit\); no model"
    with pytest.raises(RematerializeError, match=differs):
        rematerialize(model, x, "100%", time_limit=10)
    captured = capture(copy.deepcopy(model), x)
    solver.solve(captured.dag, "100%", time_limit=2).save(tmp_path / "s.json")
    with pytest.raises(RematerializeError, match=differs):
        Rematerialized.load(tmp_path / "s.json", model, x)
    run = ["run", "--model", "test_executor_check:sums_otherwise", "--budget", "100%"]
    assert main([*run, "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not bit for bit" in err


def test_a_module_that_matches_is_checked_and_left_as_found():
    """Dropout and BatchNorm: the check replays the same draws in both steps and restores the
    running statistics, so the next step (the caller's first) is eager's first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.BatchNorm1d(8), nn.Linear(8, 1))
    x = torch.randn(6, 8)
    eager = copy.deepcopy(model)
    rng = torch.get_rng_state()
    rm = rematerialize(model, x, "min", time_limit=10)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    check = rm.check
    assert check.exact and check.worst == 0.0 and check.values == 1 + 6 + 3
    assert check.seconds > 0
    for module in (eager, rm):
        torch.manual_seed(1)
        module(x).square().mean().backward()
    for (name, a), b in zip(eager.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for (name, a), b in zip(eager.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
