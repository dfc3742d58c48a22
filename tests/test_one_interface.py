"""The four runtimes' one front door (README, "One interface"): `rematerialize`,
`checkpoint_plan`, `fit` and `compile` take the same example inputs, read a budget with one
parser (`solver.core.budget.Budget`: "min" one meaning), refuse the same time limits and
unknown targets with the same line, refuse an output without a loss with the same line, and
end at the first Ctrl-C with what they have. Tiny models: each test runs in seconds."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ortools.sat.python import cp_model
from sac_models import sum_loss
from torch import nn

import executor
import solver
from graph_capture import CaptureError, capture
from solver.core.budget import Budget
from solver.errors import RematError
from solver.examples import residual_demo
from solver.target import UnknownTargetError

pytestmark = pytest.mark.usefixtures("one_thread")

FIT_MEMORY = 64 * 1024
"""Bytes: `Tiny`'s parameters, gradients and AdamW state take 13,056 of them."""


class Tiny(nn.Module):
    """Two Linear+GELU blocks; returns the last hidden state (no loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Untouched(Tiny):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model ran")


def tiny(batch: int = 2) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Tiny().train(), torch.randn(batch, 16)


def run(runtime: str, model: nn.Module, inputs: object, budget: object = "min", **kwargs):
    """`runtime` called as the README spells it, with the sum of the output as the loss where
    it runs the step itself."""
    if runtime == "rematerialize":
        return executor.rematerialize(model, inputs, budget, **kwargs)
    if runtime == "checkpoint_plan":
        return executor.checkpoint_plan(model, inputs, budget, loss_fn=sum_loss, **kwargs)
    if runtime == "compile":
        return executor.compile(
            model, inputs, budget, loss_fn=sum_loss, backend="aot_eager", **kwargs
        )
    assert runtime == "fit"
    return executor.fit(
        lambda size: (model, inputs), FIT_MEMORY, loss_fn=sum_loss, run=False, **kwargs
    )


RUNTIMES = ("rematerialize", "checkpoint_plan", "fit", "compile")


@pytest.fixture
def python_handles_sigint():
    """SIGINT with Python's default handler, as in a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# 1. the loss


@pytest.mark.parametrize("budget", ["1MiB", "50%"])
def test_an_output_without_a_loss_is_refused_in_one_line_by_every_runtime_running_the_step(
    budget,
):
    """`checkpoint_plan`, `fit` and `compile` run the step with `default_loss`: an output that
    is no loss gets one line asking for loss_fn, the same in each (the runtime's class)."""
    model, x = tiny()
    with pytest.raises(executor.PlanError) as planned:
        executor.checkpoint_plan(model, (x,), budget, time_limit=10)
    with pytest.raises(executor.CompileError) as compiled:
        executor.compile(model, (x,), budget, backend="aot_eager", time_limit=10)
    with pytest.raises(executor.FitError) as fitted:
        executor.fit(lambda batch: tiny(batch), FIT_MEMORY, time_limit=10, run=False)
    message = str(planned.value)
    assert "pass loss_fn=" in message and "\n" not in message
    assert str(compiled.value) == message == str(fitted.value)


# 2. example inputs


@pytest.mark.parametrize("runtime", ["rematerialize", "checkpoint_plan", "compile"])
def test_one_tensor_is_the_one_positional_input(runtime):
    """`example_inputs` given as one tensor `x` is `(x,)`, as README's
    `executor.compile(model, x, "50%")` writes it; not the rows of `x`."""
    model, x = tiny(batch=4)
    made = run(runtime, model, x, time_limit=20)
    if runtime == "checkpoint_plan":
        assert made.regions  # planned over the blocks of a step on x
    else:
        torch.manual_seed(1)
        assert made(x).shape == (4, 16)


def test_a_schedule_loads_with_one_tensor_as_its_example(tmp_path):
    model, x = tiny()
    path = tmp_path / "schedule.json"
    solver.solve(capture(model, (x,)).dag, "min", time_limit=10).save(path)
    assert executor.Rematerialized.load(path, model, x)(x).shape == x.shape


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_other_example_inputs_are_refused_in_one_line(runtime):
    model, x = tiny()
    with pytest.raises(RematError) as info:
        run(runtime, model, {"x": x}, time_limit=10)
    message = str(info.value)
    assert "example_inputs must be a tuple or list of the positional inputs, or one tensor, " in (
        message
    )
    assert "not a dict" in message and "\n" not in message


# 3. budgets


def test_a_budget_is_read_by_one_parser():
    assert Budget.of(" MIN ").kind == "least" and Budget.of("min").least
    assert Budget.of("50%").bytes(hundred=lambda: 1000) == 500
    assert Budget.of("512MiB").bytes() == Budget.of(2**29).bytes() == 2**29
    assert Budget.of(None).bytes(usable=lambda: 77) == 77
    with pytest.raises(ValueError, match="'min' is the least peak"):
        Budget.of("min").bytes()
    with pytest.raises(ValueError, match="cannot read memory budget 'lots'"):
        Budget.of("lots")
    with pytest.raises(ValueError, match="target device's usable memory"):
        Budget.of(None).bytes()


def test_min_is_the_least_peak_then_the_least_cost_at_it():
    """One meaning of "min" in `solver.solve`: the least peak (objective "memory"), then the
    least recompute cost at that peak."""
    graph = residual_demo(4)
    least = solver.solve(graph, objective="memory", time_limit=10)
    cheapest = solver.solve(graph, least.peak, time_limit=10)
    assert least.status == cheapest.status == "OPTIMAL" and cheapest.cost < least.cost
    found = solver.solve(graph, "min", time_limit=20)
    assert (found.peak, found.cost, found.budget) == (least.peak, cheapest.cost, least.peak)
    assert found.status == "OPTIMAL" and found.extra["least_peak"]["status"] == "OPTIMAL"


def test_rematerialize_takes_min():
    model, x = tiny()
    rm = executor.rematerialize(model, (x,), "min", time_limit=20)
    least = solver.solve(rm.captured.dag, objective="memory", time_limit=10)
    assert rm.schedule.peak == least.peak


def test_the_solver_package_never_imports_torch():
    code = (
        "import sys, solver, solver.core.budget, solver.interrupt, solver.target, solver.sac\n"
        "print('torch' in sys.modules)"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "False"


# 4. time limits and Ctrl-C


@pytest.mark.parametrize("time_limit", [0, -1.0, math.nan])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_time_limit_that_is_no_positive_number_of_seconds_is_refused_in_one_line(
    runtime, time_limit
):
    """Refused before any capture, recording or compile: the model never runs."""
    with pytest.raises(RematError) as info:
        run(runtime, Untouched(), (torch.randn(2, 16),), time_limit=time_limit)
    assert str(info.value) == (
        f"time_limit must be a positive number of seconds, not {time_limit!r}"
    )


def sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)


class InterruptsOnce(Tiny):
    """Sends SIGINT from its first forward."""

    sent = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sent:
            self.sent = True
            sigint()
        return super().forward(x)


@pytest.mark.usefixtures("python_handles_sigint")
def test_the_first_ctrl_c_ends_rematerialize_with_a_schedule():
    """SIGINT during the capture: the solve that follows ends at once, with the schedule it
    has ("min": the checkpoint-all schedule the least-peak search starts from)."""
    torch.manual_seed(0)
    rm = executor.rematerialize(InterruptsOnce().train(), (torch.randn(2, 16),), "min")
    assert rm.schedule.extra["interrupted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("python_handles_sigint")
def test_the_first_ctrl_c_ends_checkpoint_plan_with_a_plan(monkeypatch):
    """SIGINT at CP-SAT's first plan (from its callback's thread, as a terminal's arrives
    during an engine call): that plan, or a better one found before the stop, comes back; a
    SIGINT during the recording ends the call in one line."""
    sent = []
    solve = cp_model.CpSolver.Solve

    class InterruptAtFirst(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if not sent:
                sent.append(True)
                sigint()

    monkeypatch.setattr(
        cp_model.CpSolver, "Solve", lambda self, model, *_: solve(self, model, InterruptAtFirst())
    )
    model, x = tiny()
    plan = executor.checkpoint_plan(model, (x,), "100%", loss_fn=sum_loss, time_limit=60)
    assert sent and plan.peak <= plan.budget
    monkeypatch.undo()
    torch.manual_seed(0)
    with pytest.raises(executor.PlanError, match="interrupted") as info:
        executor.checkpoint_plan(InterruptsOnce().train(), (x,), "min", loss_fn=sum_loss)
    assert "\n" not in str(info.value)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# 5. errors


def test_a_capture_error_is_a_remat_error():
    assert issubclass(CaptureError, RematError)


def test_an_unknown_target_is_one_error_listing_the_known_ones():
    model, x = tiny()
    raised = []
    for call in (
        lambda: capture(model, (x,), target="tpu9"),
        lambda: executor.rematerialize(model, (x,), "min", capture_options={"target": "tpu9"}),
        lambda: executor.checkpoint_plan(model, (x,), "min", loss_fn=sum_loss, target="tpu9"),
        lambda: executor.fit(lambda b: tiny(b), None, loss_fn=sum_loss, target="tpu9"),
        lambda: executor.fit(lambda b: tiny(b), FIT_MEMORY, loss_fn=sum_loss, target="tpu9"),
    ):
        with pytest.raises(UnknownTargetError) as info:
            call()
        raised.append(str(info.value))
    assert len(set(raised)) == 1 and "unknown target 'tpu9': use one of h100" in raised[0]


# 6. one spelling per concept

README = Path(__file__).resolve().parents[1] / "README.md"
ENTRY_POINTS = {
    "solver.solve": solver.solve,
    "solver.baseline": solver.baseline,
    "solver.evict": solver.evict,
    "solver.simulate": solver.simulate,
    "graph_capture.capture": capture,
    "executor.rematerialize": executor.rematerialize,
    "executor.checkpoint_plan": executor.checkpoint_plan,
    "executor.estimate": executor.estimate,
    "executor.fit": executor.fit,
    "executor.compile": executor.compile,
    "solver.Schedule.load": solver.Schedule.load,
    "executor.Rematerialized.load": executor.Rematerialized.load,
    "executor.CheckpointPlan.load": executor.CheckpointPlan.load,
    "executor.CompiledModel.load": executor.CompiledModel.load,
}


def readme_signatures() -> dict[str, tuple[list[str], list[str]]]:
    """README "One interface"'s table: entry point -> (positional, keyword-only) names."""
    section = README.read_text().split("### One interface", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        name, positional, keyword_only = (cell.strip() for cell in row.strip("|").split("|"))
        table[name.strip("`")] = (
            re.findall(r"`([^`]+)`", positional),
            re.findall(r"`([^`]+)`", keyword_only),
        )
    return table


def signature_of(function: Callable[..., object]) -> tuple[list[str], list[str]]:
    """(positional, keyword-only) names, `*args`/`**kwargs` spelled so, as README writes them."""
    positional, keyword_only = [], []
    for p in inspect.signature(function).parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional.append(p.name)
        else:
            stars = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
            keyword_only.append(stars + p.name)
    return positional, keyword_only


def test_readmes_signature_table_holds_for_every_entry_point():
    table = readme_signatures()
    assert list(table) == list(ENTRY_POINTS)
    for name, function in ENTRY_POINTS.items():
        assert table[name] == signature_of(function), name


def test_each_concept_has_one_spelling_across_the_entry_points():
    """A parameter named for a concept is named the same wherever it appears: no entry point
    takes `memory`, `max_overhead` (or `deadline`, but `solver.solve`'s caller's Deadline)."""
    names = {n for f in ENTRY_POINTS.values() for group in signature_of(f) for n in group}
    assert not names & {"memory", "max_overhead"}
    takes_deadline = [n for n, f in ENTRY_POINTS.items() if "deadline" in signature_of(f)[1]]
    assert takes_deadline == ["solver.solve"]


def _other_spellings(tmp_path: Path) -> list[tuple[Callable[[], object], str]]:
    model, x = Untouched(), torch.randn(2, 16)
    graph = residual_demo(4)
    path = tmp_path / "unread.json"
    return [
        (
            lambda: executor.fit(lambda b: tiny(b), memory=FIT_MEMORY),
            "fit(memory=...) is spelled fit(budget=...)",
        ),
        (
            lambda: executor.fit(lambda b: tiny(b), FIT_MEMORY, max_overhead=1.3),
            "fit(max_overhead=...) is spelled fit(compute_budget=...)",
        ),
        (
            lambda: executor.fit(lambda b: tiny(b), FIT_MEMORY, "batch", 1.3, "adamw", 60),
            "fit takes 2 arguments by position (factory, budget); pass dim=, compute_budget=, "
            "optimizer=, time_limit= by keyword",
        ),
        (
            lambda: capture(model, (x,), {}),
            "capture takes 2 arguments by position (model, example_inputs); pass "
            "example_kwargs= by keyword",
        ),
        (
            lambda: solver.baseline(
                graph, "checkpoint_all", None, deadline=solver.Deadline.after(1)
            ),
            "baseline(deadline=...) is spelled baseline(time_limit=...)",
        ),
        (
            lambda: solver.evict(graph, "80%", deadline=solver.Deadline.after(1)),
            "evict(deadline=...) is spelled evict(time_limit=...)",
        ),
        (
            lambda: solver.solve(graph, memory="80%"),
            "solve(memory=...) is spelled solve(budget=...)",
        ),
        (
            lambda: solver.solve(graph, objective="memory", max_overhead=1.2),
            "solve(max_overhead=...) is spelled solve(compute_budget=...)",
        ),
        (
            lambda: executor.rematerialize(model, (x,), "min", deadline=1),
            "rematerialize(deadline=...) is spelled rematerialize(time_limit=...)",
        ),
        (
            lambda: executor.checkpoint_plan(model, (x,), memory="1MiB"),
            "checkpoint_plan(memory=...) is spelled checkpoint_plan(budget=...)",
        ),
        (
            lambda: executor.compile(model, (x,), "min", deadline=1),
            "compile(deadline=...) is spelled compile(time_limit=...)",
        ),
        (
            lambda: executor.Rematerialized.load(path, model, (x,), {}),
            "Rematerialized.load takes 3 arguments by position (path, model, example_inputs); "
            "pass example_kwargs= by keyword",
        ),
        (
            lambda: executor.CompiledModel.load(path, model, (x,), {}),
            "CompiledModel.load takes 3 arguments by position (path, model, example_inputs); "
            "pass example_kwargs= by keyword",
        ),
    ]


def test_another_spelling_is_refused_in_one_line_naming_remats(tmp_path):
    """Before anything runs: no model call, no file read, no solve."""
    for call, message in _other_spellings(tmp_path):
        with pytest.raises(solver.SpellingError) as info:
            call()
        assert str(info.value) == message
        assert isinstance(info.value, TypeError) and isinstance(info.value, RematError)


def test_remat_fit_reads_memory_and_max_overhead_as_budget_and_compute_budget():
    import cli.fit

    parser = argparse.ArgumentParser()
    cli.fit.add_fit_arguments(parser)
    for argv in (
        ["--model", "m:f", "--budget", "1MiB", "--compute-budget", "1.3x"],
        ["--model", "m:f", "--memory", "1MiB", "--max-overhead", "1.3x"],
    ):
        args = parser.parse_args(argv)
        assert (args.budget, args.compute_budget) == ("1MiB", "1.3x")
