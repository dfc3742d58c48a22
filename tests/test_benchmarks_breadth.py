"""The breadth benchmark's harness (`benchmarks.running.breadth`) on one small architecture: both
runtimes trained against eager for one step, and a runtime that differs reported as WRONG
unless eager against itself differs as early."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.running import (
    breadth,
    breadth_compile,
    breadth_models,
    breadth_report,
    breadth_steps,
)

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_row_trains_the_control_and_both_runtimes_against_eager() -> None:
    cells = breadth.run_row("vit", budget="100%", steps=1, time_limit=20)
    assert [c.runtime for c in cells] == list(breadth.RUNTIMES)
    for cell in cells:
        assert cell.result == "equal", cell
    eager, remat, sac = cells
    assert eager.budget is None and eager.peak > 0
    assert 0 < remat.peak <= remat.budget and 0 < sac.peak <= sac.budget
    # one percent basis: 100% is the measured plain step for both runtimes (their steps differ
    # by the loss's few bytes)
    assert abs(remat.budget - sac.budget) <= 0.001 * sac.budget, (remat.budget, sac.budget)
    assert sac.checkpointed.startswith("0 of ") and remat.checkpointed.endswith(" recomputes")
    assert f"| vit | hf | remat | equal | {remat.checkpointed} |" in breadth_report.table(cells)
    nothing = sum(c.checkpointed.startswith("0 ") for c in (remat, sac))
    assert (
        breadth_report.summary(cells)
        == f"3 equal ({nothing} of them checkpointing nothing) of 3 cells"
    )


def test_a_runtime_that_differs_from_eager_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    def doubled(case: breadth_models.Case, budget: str, time_limit: float):
        def call(*args, **kwargs):
            out = case.model(*args, **kwargs)
            out.loss = out.loss * 2
            return out

        return call, 1 << 30, "-"

    monkeypatch.setitem(breadth.BUILD, "remat", doubled)
    cell = breadth.run_cell("vit", "remat", "100%", steps=1, time_limit=1)
    assert cell.result.startswith("WRONG: loss differs (and "), cell.result
    assert cell.result.endswith("at step 0")


def test_a_runtime_is_wrong_only_before_eager_against_itself_differs(monkeypatch) -> None:
    def doubled_from_step_1(case: breadth_models.Case, budget: str, time_limit: float):
        steps = iter(range(10))

        def call(*args, **kwargs):
            out = case.model(*args, **kwargs)
            out.loss = out.loss * (2 if next(steps) >= 1 else 1)
            return out

        return call, 1 << 30, "-"

    monkeypatch.setitem(breadth.BUILD, "remat", doubled_from_step_1)
    run = lambda control: breadth.run_cell("vit", "remat", "100%", 2, 1, control)  # noqa: E731
    assert run(None).result.startswith("WRONG: loss differs")
    assert run(2).result.startswith("WRONG: loss differs")
    assert run(1).result.startswith("as eager: loss differs")


def test_first_difference_compares_bits() -> None:
    a = torch.tensor([0.0, float("nan")])
    assert (
        breadth_steps.first_difference({"loss": a, "g": None}, {"loss": a.clone(), "g": None})
        is None
    )
    got = breadth_steps.first_difference({"loss": a, "g": a}, {"loss": a + 1, "g": None})
    assert got == "loss differs (and 1 more)"
    assert not breadth_steps.same_bits(a, torch.tensor([-0.0, float("nan")]))


def _tiny() -> breadth_models.Case:
    """A classifier small enough to compile in seconds: two linear layers, ReLU, dropout."""
    from benchmarks.running.breadth_models import Classify, tensor_loss

    net = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 4)
    )
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    return breadth_models.Case(
        Classify(net).train(), (x,), {"labels": torch.arange(64) % 4}, tensor_loss
    )


@pytest.mark.long  # inductor compiles: 21 s of CPU with a cold inductor cache, 11 s warm
def test_compile_cells_hold_remat_against_eager_and_torch_compile(monkeypatch) -> None:
    """The compile cells on a tiny model: "min" close to eager though its parameters are moved
    5% after the compile (each step starts from eager's state); the mid cell, its compiled step
    made to scale the loss by 1.01, WRONG at step 0 while torch's own compiled step is close."""
    import executor

    compile_ = executor.compile

    def scaled_at_mid(model, inputs, budget, **kwargs):
        compiled = compile_(model, inputs, budget, **kwargs)
        if budget == "min":
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.05)
        else:
            call = compiled._call
            compiled._call = lambda *a, **k: call(*a, **k) * 1.01
        return compiled

    monkeypatch.setitem(breadth_models.ARCHITECTURES, "tiny", ("test", _tiny))
    monkeypatch.setattr(executor, "compile", scaled_at_mid)
    tolerance = breadth_compile.CompileTolerance()
    least, mid = breadth_compile.compile_cells(
        "tiny", "mid", 2, time_limit=120, tolerance=tolerance
    )
    assert (least.runtime, mid.runtime) == ("compile min", "compile mid")
    assert least.result.startswith("close: "), least
    assert least.budget is None and least.peak > 0
    assert mid.result.startswith("WRONG: loss differs by 0.01 (torch.compile "), mid
    assert mid.result.endswith(") at step 0") and mid.differs_at == 0
    assert least.peak <= mid.budget  # torch's compiled step peaks no higher here
    assert breadth_report.summary([least, mid]) == "1 close, 1 WRONG of 2 cells"


def test_compile_distances_take_a_missing_grad_as_equal_only_where_both_miss_it():
    """A parameter the loss does not reach has no `.grad` (CLIP vision's): None against None
    is no difference, None against a tensor an infinite one, never an AttributeError."""
    one = torch.ones(3)
    want = {"a": None, "b": one, "c": None}
    got = {"a": None, "b": one * (1 + 1e-6), "c": one}
    distances = breadth_compile._distances(want, got, floor=1e-3)
    assert distances["a"] == 0.0 and 0 < distances["b"] < 1e-5 and distances["c"] == math.inf


def test_the_grid_puts_each_architectures_runtimes_on_one_row():
    cell = breadth_report.Cell
    cells = [
        cell("gpt2", "hf", "eager", "equal", peak=2**20),
        cell("gpt2", "hf", "remat", "equal", "11 recomputes", 2**19, 2**20, 3.0),
        cell("gpt2", "hf", "compile min", "close: 1e-07 (torch.compile 1e-07)", "2 recomputes"),
        cell("tv_vit", "torchvision", "eager", "refused: A|B"),
    ]
    assert breadth_report.grid(cells).splitlines() == [
        "| architecture | family | eager | remat | compile min |",
        "|---|---|---|---|---|",
        "| gpt2 | hf | equal; 1.000 MiB | equal; 11 recomputes; 0.500 MiB of 1.000 MiB "
        "| close: 1e-07 (torch.compile 1e-07); 2 recomputes |",
        "| tv_vit | torchvision | refused: A\\|B | - | - |",
    ]
