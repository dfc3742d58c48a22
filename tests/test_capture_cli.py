"""`remat profile` and the --model / --demo model sources of `remat solve`."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from cli.main import main


def small_model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A factory for --model: a two-layer MLP and a batch."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, (torch.randn(4, 8),)


def keyword_model() -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """A factory for --model returning keyword inputs too: model(x, input2=y)."""
    return nn.Bilinear(8, 3, 2), (torch.randn(4, 8),), {"input2": torch.randn(4, 3)}


def test_factory_may_return_keyword_inputs(capsys) -> None:
    # 200%: on a model this small the executor's held bytes exceed the plain step (100%)
    args = ["solve", "--model", f"{__name__}:keyword_model", "--budget", "200%"]
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


def test_a_factory_module_in_the_current_directory_is_found(tmp_path, monkeypatch, capsys):
    """As ``python -m`` would: the console script's sys.path does not hold the working
    directory, yet ``--model mymodels:make`` run where mymodels.py lies must import it (and
    leave sys.path as it was)."""
    (tmp_path / "remat_cwd_models.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make():\n    return nn.Linear(4, 2), (torch.randn(3, 4),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    assert main(["profile", "--model", "remat_cwd_models:make", "--cost-model", "flops"]) == 0
    assert "saved for backward" in capsys.readouterr().out
    assert sys.path == before


def test_a_captured_graph_records_its_thread_count_and_schedules_carry_it(tmp_path) -> None:
    """Op workspaces depend on torch's intra-op thread count, so the graph says which count it
    was captured with, and a schedule solved for it says so too."""
    import solver
    from solver.io import load_graph

    path = tmp_path / "mlp.json"
    argv = ["profile", "--model", f"{__name__}:small_model", "--threads", "1"]
    assert main([*argv, "--save-graph", str(path)]) == 0
    graph = load_graph(path)
    assert graph.graph["threads"] == 1
    assert solver.solve(graph, "100%", time_limit=5).extra["threads"] == 1
