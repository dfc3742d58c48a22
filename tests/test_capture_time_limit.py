"""`capture(..., time_limit=)`: seconds for the whole call, one `solver.Deadline` that every
step of the capture checks before it begins; past it, `CaptureError` saying what to do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cli.main import main
from graph_capture import CaptureError, capture
from solver.deadline import Deadline

pytestmark = pytest.mark.usefixtures("one_thread")


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A two-layer MLP and a batch (a factory for --model too)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), (torch.randn(4, 8),)


def test_a_tiny_time_limit_is_refused_saying_what_to_do():
    model, x = mlp()
    with pytest.raises(CaptureError) as measured:
        capture(model, x, time_limit=1e-9)
    assert str(measured.value) == (
        "capture ran past time_limit=1e-09 s (the deadline passed before the trace): raise "
        "time_limit, or measure fewer passes (repeats=5: each beyond the first is one more "
        "timed run of the step)"
    )
    with pytest.raises(CaptureError) as estimated:
        capture(model, x, target="h100", time_limit=1e-9)
    assert str(estimated.value) == (
        "capture ran past time_limit=1e-09 s (the deadline passed before the trace): raise "
        "time_limit"
    )


@pytest.mark.parametrize("time_limit", [0, -1.0, float("nan"), "60"])
def test_a_time_limit_that_is_no_positive_number_is_refused_as_every_entry_point_refuses_it(
    time_limit,
):
    model, x = mlp()
    with pytest.raises(CaptureError) as info:
        capture(model, x, time_limit=time_limit)
    assert str(info.value) == (
        f"time_limit must be a positive number of seconds, not {time_limit!r}"
    )


@pytest.mark.parametrize("target", [None, "h100"])
def test_a_time_limit_that_holds_returns_the_same_graph(target):
    """FLOPs as costs: the graph, its measured seconds (``time``) aside, does not depend on
    the clock."""
    model, x = mlp()
    unlimited = capture(model, x, cost_model="flops", target=target).dag
    limited = capture(model, x, cost_model="flops", target=target, time_limit=600).dag

    def untimed(dag):
        return [(n, {k: v for k, v in d.items() if k != "time"}) for n, d in dag.nodes(data=True)]

    assert untimed(limited) == untimed(unlimited)
    assert list(limited.edges(data=True)) == list(unlimited.edges(data=True))
    same = {k: v for k, v in unlimited.graph.items() if k != "step_cost"}
    assert {k: v for k, v in limited.graph.items() if k != "step_cost"} == same


def _recording(monkeypatch) -> list[tuple[Deadline, str]]:
    """Every `Deadline.check` made from now on, with the deadline it was made on."""
    made: list[tuple[Deadline, str]] = []
    check = Deadline.check

    def recorded(self: Deadline, before: str) -> None:
        made.append((self, before))
        check(self, before)

    monkeypatch.setattr(Deadline, "check", recorded)
    return made


def test_every_step_of_a_measured_capture_checks_the_one_deadline(monkeypatch):
    model, x = mlp()
    made = _recording(monkeypatch)
    captured = capture(model, x, repeats=3, plain_peak=True, time_limit=600)
    assert len({id(deadline) for deadline, _ in made}) == 1
    steps = [before for _, before in made]
    ops = [f"running {n.name} on the example tensors" for n in captured.joint.graph.nodes]
    ops = [step for step in ops if step in steps]
    assert len(ops) == sum(n.op == "call_function" for n in captured.joint.graph.nodes)
    assert steps == [
        "the trace",
        *ops,
        "measuring the ops' scratch bytes",
        "timed pass 1 of 2",
        "timed pass 2 of 2",
        "timing the gradient accumulation",
        "the plain step's peak",
        "grouping the graph",
    ]


def test_every_step_of_an_estimate_checks_the_one_deadline(monkeypatch):
    model, x = mlp()
    made = _recording(monkeypatch)
    captured = capture(model, x, target="h100", time_limit=600)
    assert len({id(deadline) for deadline, _ in made}) == 1
    steps = [before for _, before in made]
    calls = sum(n.op == "call_function" for n in captured.joint.graph.nodes)
    assert steps[0] == "the trace" and steps[-1] == "grouping the graph"
    assert len(steps) == calls + 2
    assert all(step.endswith(" on fake tensors") for step in steps[1:-1])


def test_a_deadline_passing_between_two_timed_passes_ends_the_capture_there(monkeypatch):
    model, x = mlp()
    check = Deadline.check

    def passes_at_the_second_pass(self: Deadline, before: str) -> None:
        check(Deadline(0.0) if before == "timed pass 2 of 4" else self, before)

    monkeypatch.setattr(Deadline, "check", passes_at_the_second_pass)
    with pytest.raises(CaptureError, match=r"the deadline passed before timed pass 2 of 4\)"):
        capture(model, x, time_limit=600)


def test_remat_solve_passes_its_time_limit_to_the_capture(capsys):
    argv = ["solve", "--model", f"{__name__}:mlp", "--time-limit", "1e-9", "--quiet"]
    assert main(argv) == 2
    assert "capture ran past time_limit=1e-09 s" in capsys.readouterr().err
