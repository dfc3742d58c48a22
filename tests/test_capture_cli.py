"""`remat profile` and the --model / --demo model sources of `remat solve`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from executor.cli import main


def small_model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A factory for --model: a two-layer MLP and a batch."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, (torch.randn(4, 8),)


def keyword_model() -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """A factory for --model returning keyword inputs too: model(x, input2=y)."""
    return nn.Bilinear(8, 3, 2), (torch.randn(4, 8),), {"input2": torch.randn(4, 3)}


def test_factory_may_return_keyword_inputs(capsys) -> None:
    args = ["solve", "--model", f"{__name__}:keyword_model", "--budget", "100%"]
    assert main([*args, "--time-limit", "5", "--quiet", "--no-baselines"]) == 0
    assert "exact" in capsys.readouterr().out


def test_profile_demo_prints_tables_and_saves_plot(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "unet.png"
    assert main(["profile", "unet", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "per block (module depth 2)" in out and "down1" in out
    assert "best to recompute" in out
    assert plot.stat().st_size > 0


def test_profile_loads_a_model_factory(capsys) -> None:
    assert main(["profile", "--model", f"{__name__}:small_model", "--cost-model", "flops"]) == 0
    assert "saved for backward" in capsys.readouterr().out


def test_profile_saves_the_dag_for_remat_solve(tmp_path) -> None:
    path = tmp_path / "mlp.json"
    argv = ["profile", "--model", f"{__name__}:small_model", "--save-graph", str(path)]
    assert main(argv) == 0
    assert main(["solve", str(path), "--budget", "100%", "--time-limit", "5", "--quiet"]) == 0


def test_solve_runs_on_a_captured_model(capsys) -> None:
    args = ["solve", "--model", f"{__name__}:small_model", "--budget", "100%"]
    assert main([*args, "--time-limit", "5", "--quiet", "--no-baselines"]) == 0
    assert "exact" in capsys.readouterr().out


def test_bad_factory_is_a_clear_error(capsys) -> None:
    assert main(["profile", "--model", "no_such_module:make"]) == 2
    assert "cannot load --model" in capsys.readouterr().err
