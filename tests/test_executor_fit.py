"""`executor.fit` and `remat fit`: affine bytes detected (and their absence), the proof at
size + 1 on a capture, one real step at the size found measured within the memory, eager's
size + 1 measured over, and every bad input refused in one line."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

import executor
from cli.main import main
from executor.fitting.graphs import SizedGraphs
from solver.fitting.sizes import DOES_NOT_FIT

pytestmark = pytest.mark.usefixtures("one_thread")

MEMORY = 400 * 1024
"""Bytes: the parameters, gradients and AdamW state of `Blocks` take 266,272 of them."""


class Blocks(nn.Module):
    """Four Linear+GELU blocks; the loss is the mean square: bytes affine in the batch."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def blocks(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Blocks(), (torch.randn(batch, 64),)


class Attention(nn.Module):
    """Self-attention scores: seq x seq bytes, not affine in the sequence length."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        return (q @ q.transpose(1, 2)).softmax(-1).mean()


def attention(seq: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Attention(), (torch.randn(1, seq, 16),)


class Branchy(nn.Module):
    """One more op from batch 3 on: the graph changes shape with the size."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if x.shape[0] >= 3:
            y = torch.tanh(y)
        return y.mean()


def test_bytes_affine_in_the_batch_are_detected_and_predicted_exactly():
    graphs = SizedGraphs(blocks, (2, 3, 4), "batch")
    assert graphs.affine and not graphs.not_affine
    assert graphs.mismatches(7) == []  # a capture at 7 has exactly the predicted bytes


def test_bytes_quadratic_in_the_sequence_are_not_affine_and_every_size_is_captured():
    graphs = SizedGraphs(attention, (2, 3, 4), "seq")
    assert not graphs.affine and graphs.not_affine
    graphs(6)
    assert 6 in graphs.captures  # not extrapolated: captured at the size asked for


def test_a_fit_over_bytes_that_are_not_affine_captures_each_size_it_decides():
    found = executor.fit(attention, 64 * 1024, dim="seq", time_limit=120, run=False)
    assert found.bytes_model.startswith("not affine") and found.proven
    assert {p.size for p in found.probes} >= {found.size, found.size + 1}


class Padded(nn.Module):
    """A buffer of at least 5 rows: its bytes are constant up to batch 5, then grow."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = x.new_ones(max(x.shape[0], 5), 64)
        return self.lin(x).mean() + pad.sum()


def test_a_capture_that_refutes_the_affine_prediction_turns_to_captures_at_every_size():
    graphs = SizedGraphs(lambda b: (Padded(), (torch.randn(b, 8),)), (2, 3, 4), "batch")
    assert graphs.affine  # affine at 2, 3 and 4 ...
    assert graphs.refute(8) and not graphs.affine  # ... but not at 8
    assert any("at batch 8" in m for m in graphs.not_affine)
    graphs(6)
    assert 6 in graphs.captures


def test_a_graph_that_changes_shape_with_the_size_is_refused():
    with pytest.raises(executor.FitError, match="changes shape with the batch"):
        SizedGraphs(lambda b: (Branchy(), (torch.randn(b, 8),)), (2, 3, 4), "batch")


def test_fit_runs_one_step_within_the_memory_and_proves_the_next_size_on_its_capture():
    found = executor.fit(blocks, MEMORY, dim="batch", optimizer="adamw", time_limit=120)
    assert found.size is not None and found.proven and found.upper == found.size + 1
    assert found.measured_peak is not None and found.measured_peak <= MEMORY
    assert found.budget == MEMORY - found.static.total
    assert found.schedule.peak <= found.budget
    # the answer and size + 1 are captured, and equal the prediction the probes decided on
    verdicts = {p.size: p.verdict for p in found.probes}
    assert verdicts[found.size + 1] == DOES_NOT_FIT and found.stopped is None
    assert "match the prediction" in found.bytes_model
    assert found.eager_size is not None and found.eager_size <= found.size
    assert found.eager_over is not None and found.eager_over > MEMORY
    assert found.static.optimizer_state >= 2 * found.static.parameters  # AdamW's two moments


class Hidden(Blocks):
    """`Blocks` returning its last activations: the loss is the caller's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_loss_fn_is_the_step_s_loss_as_in_checkpoint_plan():
    """`loss_fn(output)` makes the step `blocks` trains: the same size; the default loss
    refuses an output that is no loss and asks for loss_fn."""

    def hidden(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        return Hidden(), (torch.randn(batch, 64),)

    found = executor.fit(
        hidden, MEMORY, time_limit=30, run=False, loss_fn=lambda out: out.square().mean()
    )
    assert found.size == executor.fit(blocks, MEMORY, time_limit=30, run=False).size
    with pytest.raises(executor.FitError, match=r"shape \(2, 64\).*pass loss_fn="):
        executor.fit(hidden, MEMORY, time_limit=10, run=False)


def test_the_optimizer_changes_what_exists_before_the_step():
    adamw = executor.fit(blocks, MEMORY, optimizer="adamw", time_limit=120, run=False)
    none = executor.fit(blocks, MEMORY, optimizer="none", time_limit=120, run=False)
    assert none.static.optimizer_state == 0 and none.size > adamw.size


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module `fit_models` in the working directory, as `--model` imports it."""
    (tmp_path / "fit_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            from test_executor_fit import blocks

            def fails_at_three(batch):
                if batch == 3:
                    raise RuntimeError("no data loader for batch 3")
                return blocks(batch)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--model", "fit_models:fails_at_three", "--memory", "1MiB"],
            "the factory failed at batch 3: RuntimeError: no data loader for batch 3",
        ),
        (
            ["--model", "test_executor_fit:blocks", "--memory", "200KiB"],
            "below the 266272 B that the parameters",
        ),
        (
            ["--model", "test_executor_fit:blocks", "--memory", "1MiB", "--max-overhead", "0.9x"],
            "compute budget '0.9x' is below 1.0",
        ),
    ],
)
def test_remat_fit_refuses_bad_input_in_one_line(factories, capsys, argv, message):
    assert main(["fit", *argv, "--time-limit", "5"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
