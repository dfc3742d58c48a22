"""`executor.fit` within one deadline and one Ctrl-C: every solve gets the fit's deadline, the
time limit covers captures and steps, the first SIGINT ends the fit with what is known and the
second aborts; the search starts where the graph's shape is stable; per-block checkpointing is
compared within the cap; an eager step that contradicts the proof is flagged."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from deadline_checks import assert_solves_share_the_calls_deadline
from test_executor_fit import MEMORY, attention, blocks
from torch import nn

import executor
import solver.fitting.probe
from executor.fitting.graphs import SizedGraphs
from executor.fitting.memory import TrainingStep
from solver.fitting.per_block import per_block_peak

pytestmark = pytest.mark.usefixtures("one_thread")

ATTENTION_MEMORY = 64 * 1024
"""Bytes: `attention` fits up to seq 16 there, so the search captures seq 8."""


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """SIGINT with Python's default handler, as in a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_every_solve_in_a_fit_gets_the_fits_one_deadline_and_stop(monkeypatch):
    """Every solve's deadline is the fit's own or a share of it (`deadline_checks`)."""
    assert_solves_share_the_calls_deadline(
        monkeypatch,
        solver.fitting.probe,
        lambda: executor.fit(attention, ATTENTION_MEMORY, dim="seq", time_limit=8, run=False),
    )


def at_seq_8(then):
    """`attention`, calling `then()` when built at seq 8 (a size the search captures)."""

    def factory(seq):
        if seq == 8:
            then()
        return attention(seq)

    return factory


def test_the_time_limit_covers_captures_and_steps(monkeypatch):
    """The capture at seq 8 runs past the limit: the fit returns what is known, runs no step.
    The clock every deadline reads (`time.perf_counter`) jumps past the limit there, so that
    where the limit falls depends on no machine's speed."""
    limit, shift = 60.0, [0.0]
    clock = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: clock() + shift[0])

    def past_the_limit():
        shift[0] = limit

    found = executor.fit(at_seq_8(past_the_limit), ATTENTION_MEMORY, dim="seq", time_limit=limit)
    assert found.stopped == "time limit" and not found.proven
    assert found.size is not None and found.size >= 4 and found.upper is None
    assert found.measured_peak is None and found.eager_size is None  # not started after it
    assert any("not run by the deadline" in n for n in found.notes)
    assert max(p.size for p in found.probes) == 8  # the search started nothing after it


def test_the_first_sigint_ends_the_fit_with_what_is_known():
    found = executor.fit(
        at_seq_8(lambda: os.kill(os.getpid(), signal.SIGINT)),
        ATTENTION_MEMORY,
        dim="seq",
        time_limit=60,
    )
    assert found.stopped == "interrupted" and found.size is not None and found.size >= 4
    assert max(p.size for p in found.probes) == 8
    assert found.measured_peak is None and found.eager_size is None
    assert "\ninterrupted at " in found.summary()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_sigint_aborts_the_fit():
    def twice():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        executor.fit(at_seq_8(twice), ATTENTION_MEMORY, dim="seq", time_limit=60)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class OneOpMoreFromTwo(nn.Module):
    """One more op from batch 2 on (as HF models branch at sequence length 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if x.shape[0] > 1:
            y = torch.tanh(y)
        return y.square().mean()


def test_the_search_starts_where_the_graph_has_the_captured_shape():
    graphs = SizedGraphs(lambda b: (OneOpMoreFromTwo(), (torch.randn(b, 8),)), (2, 3, 4), "batch")
    start, note = graphs.stable_from(1)
    assert start == 2 and "changes shape below batch 2" in note
    assert graphs.stable_from(3) == (3, None)


def gpt2(seq: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A one-layer HF GPT-2 whose loss is the forward's output (its graph differs at seq 1)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = GPT2Config(
                n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=256,
                bos_token_id=0, eos_token_id=0, use_cache=False,
            )  # fmt: skip
            self.model = GPT2LMHeadModel(config)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, labels=ids).loss

    torch.manual_seed(0)
    return Loss(), (torch.randint(0, 50, (1, seq)),)


def test_a_hf_gpt2_fit_over_the_sequence_starts_where_its_graph_is_stable():
    found = executor.fit(gpt2, "1MiB", dim="seq", compute_budget="1.3x", high=4, run=False)
    assert found.low == 2 and any("changes shape below seq 2" in n for n in found.notes)
    assert found.size is not None and found.size >= 2


def test_per_block_checkpointing_is_compared_within_the_cap():
    graph = SizedGraphs(blocks, (2, 3, 4), "batch")(4)
    assert per_block_peak(graph, None) is not None
    assert per_block_peak(graph, "1.0x") is None  # every depth recomputes a forward
    found = executor.fit(blocks, MEMORY, compute_budget="1.0x", time_limit=30, run=False)
    assert found.per_block_size is None
    assert "per-block checkpoint (predicted, within 1.0x)" in found.summary()


def test_an_eager_step_within_the_memory_at_a_size_proven_not_to_fit_is_flagged(monkeypatch):
    monkeypatch.setattr(TrainingStep, "measured_peak", lambda self: 0)  # every step "fits"
    found = executor.fit(blocks, MEMORY, time_limit=30)
    assert found.proven and found.eager_size == found.size + 1
    assert any("the proof says does not fit" in w for w in found.warnings)
    assert "WARNING: eager trains at batch" in found.summary()
