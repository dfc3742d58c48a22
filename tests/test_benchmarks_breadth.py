"""The breadth benchmark's harness (`benchmarks.breadth`) on one small architecture: both
runtimes trained against eager for one step, and a runtime that differs reported as WRONG."""

from __future__ import annotations

import pytest
import torch

from benchmarks import breadth

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_row_trains_both_runtimes_against_eager_within_their_budgets() -> None:
    cells = breadth.run_row("vit", budget="100%", steps=1, time_limit=1)
    assert [c.runtime for c in cells] == list(breadth.RUNTIMES)
    for cell in cells:
        assert cell.result == "equal", cell
        assert 0 < cell.peak <= cell.budget
    assert "| vit | hf | remat | equal |" in breadth.table(cells)
    assert breadth.summary(cells) == "2 equal of 2 cells"


def test_a_runtime_that_differs_from_eager_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    def doubled(case: breadth.Case, budget: str, time_limit: float):
        def call(*args, **kwargs):
            out = case.model(*args, **kwargs)
            out.loss = out.loss * 2
            return out

        return call, 1 << 30

    monkeypatch.setitem(breadth.BUILD, "remat", doubled)
    cell = breadth.run_cell("vit", "remat", "100%", steps=1, time_limit=1)
    assert cell.result.startswith("WRONG: loss differs (and "), cell.result
    assert cell.result.endswith("at step 0")


def test_first_difference_names_the_tensor() -> None:
    a = torch.zeros(3)
    assert breadth.first_difference({"loss": a, "g": None}, {"loss": a.clone(), "g": None}) is None
    got = breadth.first_difference({"loss": a, "g": a}, {"loss": a + 1, "g": None})
    assert got == "loss differs (and 1 more)"
