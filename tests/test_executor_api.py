"""Rematerialized as a drop-in module: errors, schedule files, accumulation, measured memory."""

from __future__ import annotations

import copy
import re
import time

import networkx as nx
import pytest
import torch
from torch import nn

import executor
import solver
from executor.errors import InputMismatchError, UnsupportedScheduleError
from executor.memory import measure_peak
from executor.traced.module import Rematerialized
from executor.traced.rematerialize import rematerialize
from graph_capture import capture
from graph_capture.measurement.device import fork_rng, generator
from graph_capture.measurement.peak import plain_step_peak
from solver import prepare
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import plan_from_keep, plan_to_ops
from solver.errors import InvalidScheduleError, ScheduleMismatchError, SolverTimeoutError

pytestmark = pytest.mark.usefixtures("one_thread")


def small_model(width: int = 16, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(width, width),
        nn.LayerNorm(width),
        nn.Dropout(0.2),
        nn.GELU(),
        nn.Linear(width, width),
        nn.Dropout(0.2),
        nn.GELU(),
        nn.Linear(width, width),
    ).train()
    return model, torch.randn(8, width)


def keep_schedule(captured, keep_every: int) -> Schedule:
    """Keep every `keep_every`-th node (0: keep none), recompute the rest."""
    problem = prepare(captured.dag)
    keep = [i for i in range(problem.n) if keep_every and i % keep_every == 0]
    ops = plan_to_ops(problem, plan_from_keep(problem, keep))
    return make_schedule(captured.dag, problem, ops, method="test-keep")


@pytest.fixture(scope="module")
def captured_small():
    model, x = small_model()
    return model, x, capture(model, [x])


def test_wrong_input_shape_dtype_count_say_what_differs(captured_small):
    model, x, captured = captured_small
    rm = Rematerialized(model, captured, keep_schedule(captured, 1))
    with pytest.raises(InputMismatchError, match=r"shape \(8, 16\).*shape \(4, 16\)") as info:
        rm(torch.randn(4, 16))
    assert "drop_last=True" in str(info.value)  # another batch size: the last batch's hint
    with pytest.raises(InputMismatchError, match=r"torch.float32.*torch.float64") as info:
        rm(x.double())
    assert "drop_last" not in str(info.value)
    with pytest.raises(InputMismatchError, match=r"expected 1 positional tensor inputs.*got 2"):
        rm(x, x)


def test_schedule_for_another_graph_is_refused(captured_small):
    model, _, captured = captured_small
    other_model, other_x = small_model(width=8)
    other = capture(other_model, [other_x])
    with pytest.raises(ScheduleMismatchError, match="Solve a new schedule"):
        Rematerialized(model, captured, keep_schedule(other, 1))


def test_schedule_the_simulator_rejects_is_refused(captured_small):
    model, _, captured = captured_small
    schedule = keep_schedule(captured, 1)
    first_compute = next(i for i, (kind, _) in enumerate(schedule.ops) if kind == "compute")
    del schedule.ops[first_compute]
    with pytest.raises(InvalidScheduleError, match=r"not live|never computed"):
        Rematerialized(model, captured, schedule)


def test_schedule_computing_a_tangent_reader_before_the_output_is_refused(captured_small):
    model, _, captured = captured_small
    problem = prepare(captured.dag)
    # every node once, backward nodes as early as the edges allow, nothing freed: valid for the
    # simulator, but the loss gradient is needed before the loss exists
    order = nx.lexicographical_topological_sort(
        captured.dag, key=lambda v: (not captured.dag.nodes[v]["backward"], problem.index[v])
    )
    ops = [("compute", problem.index[v]) for v in order]
    schedule = make_schedule(captured.dag, problem, ops, method="test-bad-split")
    with pytest.raises(UnsupportedScheduleError, match="forward output 0"):
        Rematerialized(model, captured, schedule)


def test_schedule_file_round_trip_and_refusal_of_another_graph(tmp_path):
    model, x = small_model()
    captured = capture(model, [x])
    path = tmp_path / "schedule.json"
    keep_schedule(captured, 2).save(path)
    eager_model, remat_model = copy.deepcopy(model), copy.deepcopy(model)
    rm = Rematerialized.load(path, remat_model, [x])
    torch.manual_seed(3)
    eager_model(x).sum().backward()
    torch.manual_seed(3)
    rm(x).sum().backward()
    for a, b in zip(eager_model.parameters(), remat_model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    other_model, other_x = small_model(width=8)
    with pytest.raises(ScheduleMismatchError):
        Rematerialized.load(path, other_model, [other_x])


def test_the_old_loading_spelling_names_the_new_one():
    with pytest.raises(TypeError, match=r"Rematerialized\.load\(path, model, example_inputs"):
        Rematerialized.from_file(nn.Linear(2, 2), [torch.randn(1, 2)], "s.json")


def test_rematerialize_returns_within_its_time_limit_or_says_what_it_needs():
    """`time_limit` bounds capture and solve together: either the call returns within it (with
    the solver's margin and a generous one for a loaded machine) or the capture ran past it
    and the error says so. The budget fits (the least is 18,432 B: three generator states
    beside a small step), so only the time can end it."""
    model, x = small_model()
    began = time.perf_counter()
    try:
        rematerialize(model, [x], 40_000, time_limit=0.2, workers=1)
    except SolverTimeoutError as error:
        assert "time_limit" in str(error)
    assert time.perf_counter() - began < 0.2 * 1.05 + 0.5 + 10


def test_a_percentage_is_of_the_measured_plain_step():
    """100% is the plain step's peak that capture measures (graph attribute plain_peak)."""
    model, x = small_model()
    captured = capture(model, [x], plain_peak=True)
    plain = captured.dag.graph["plain_peak"]
    summed = plain_step_peak(model, lambda: model(x).sum().backward())
    assert abs(plain - summed) <= 0.05 * summed, (plain, summed)  # a loss's few bytes apart
    assert solver.parse_budget("50%", solver.prepare(captured.dag)) == plain // 2


def test_a_budget_below_the_least_names_the_least_as_a_percentage_that_fits():
    """On a model this small the least peak is above the plain step (100%): the error gives
    it in percent too, and that percentage solves."""
    model, x = small_model()
    graph = capture(model, [x], plain_peak=True).dag
    with pytest.raises(solver.InfeasibleBudgetError) as info:
        solver.solve(graph, "100%", time_limit=10)
    least = re.search(r"([0-9.]+)% of the measured plain step", str(info.value))
    assert least, str(info.value)
    assert solver.solve(graph, f"{least.group(1)}%", time_limit=10).peak == info.value.minimum_bytes


def test_a_budget_below_the_least_names_the_bytes_held_beside_the_values_exactly():
    """The least peak is the least of the values and op workspaces alone plus the bytes the
    executor holds at every op (generator states of the two dropouts, one more put aside
    while one replays, the output and its tangent): the error names them, to the byte."""
    model, x = small_model()
    graph = capture(model, [x], plain_peak=True).dag
    held = graph.graph["held_bytes"]
    state = torch.default_generator.get_state().nbytes
    assert held["rng_states"] == 3 * state
    with pytest.raises(solver.InfeasibleBudgetError) as info:
        solver.solve(graph, "100%", time_limit=10)
    total = sum(held.values())
    parts = ", ".join(f"{k} {v}" for k, v in held.items() if v)
    message = str(info.value)
    assert f"of which {total} bytes are held beside the values at every op ({parts})" in message
    assert "\n" not in message
    bare = graph.copy()
    del bare.graph["held_bytes"]
    for v in bare.nodes:
        bare.nodes[v]["transient"] -= total
    least = solver.solve(bare, objective="memory", time_limit=10).peak
    assert least == info.value.minimum_bytes - total


class _LossAndHidden(nn.Module):
    """Returns (loss, hidden): a step backpropagates from the loss only."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(self.lin(x))
        return hidden.square().mean(), hidden


def test_a_schedule_file_loads_with_the_capture_options_it_was_solved_with(tmp_path):
    """`load` takes `capture_options` as `rematerialize` does: a schedule solved on a
    capture that backpropagates from the loss alone belongs to that capture only."""
    torch.manual_seed(0)
    model, x = _LossAndHidden(), torch.randn(4, 8)
    options = {"backward_from": [0]}
    captured = capture(model, [x], **options)
    path = tmp_path / "loss_only.json"
    solver.solve(captured.dag, "100%", time_limit=5).save(path)
    with pytest.raises(ScheduleMismatchError):
        Rematerialized.load(path, copy.deepcopy(model), [x])
    remat_model, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    rm = Rematerialized.load(path, remat_model, [x], capture_options=options)
    rm(x)[0].backward()
    eager_model(x)[0].backward()
    for a, b in zip(eager_model.parameters(), remat_model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_rematerialize_one_call_and_grad_accumulation_over_micro_batches():
    model, x = small_model()
    eager_model = copy.deepcopy(model)
    # bytes: on a model this small the executor's own held bytes put its checkpoint-all above
    # the measured plain step (100%)
    full = solver.checkpoint_all_peak(solver.prepare(capture(copy.deepcopy(model), [x]).dag))
    rm = rematerialize(model, [x], full, time_limit=20)
    torch.manual_seed(5)
    for _ in range(2):
        eager_model(x).square().sum().backward()
    torch.manual_seed(5)
    for _ in range(2):  # two micro-batches, no zero_grad: .grad accumulates like autograd's
        rm(x).square().sum().backward()
    for a, b in zip(eager_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_inputs_requiring_grad_receive_the_eager_gradient():
    model, x = small_model()
    captured = capture(model, [x.clone().requires_grad_()])
    rm = Rematerialized(copy.deepcopy(model), captured, keep_schedule(captured, 3))
    xe, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(2)
    copy.deepcopy(model)(xe).sum().backward()
    torch.manual_seed(2)
    rm(xr).sum().backward()
    assert xr.grad is not None and torch.equal(xe.grad, xr.grad)


def test_input_requiring_grad_against_a_capture_without_is_refused(captured_small):
    model, x, captured = captured_small
    rm = Rematerialized(model, captured, keep_schedule(captured, 1))
    with pytest.raises(InputMismatchError, match="requires grad"):
        rm(x.clone().requires_grad_())


def test_eval_mode_runs_the_model_itself(captured_small):
    model, x, captured = captured_small
    rm = Rematerialized(model, captured, keep_schedule(captured, 1)).eval()
    with torch.no_grad():
        assert torch.equal(rm(x), model(x))
    model.train()


def measured_step_peak(rm: Rematerialized, inputs, backward, device: str = "cpu") -> int:
    """Measured peak of one step (after a warm-up step), `.grad` allocated before it, the RNG
    state left as it was (measure only)."""
    for p in rm.parameters():
        p.grad = torch.zeros_like(p)  # gradient buffers exist before the step, like params
    with fork_rng(torch.device(device)):
        backward(rm(*inputs))
        return measure_peak(lambda: backward(rm(*inputs)), device).peak_bytes


@pytest.mark.parametrize(
    ("keep_every", "granularity"), [(1, "op"), (3, "op"), (0, "op"), (0, "module")]
)
def test_measured_peak_is_the_predicted_peak(keep_every, granularity, device):
    """Capture's transients (op workspaces, RNG states, held outputs) make the schedule's peak
    the step's measured peak, to the byte but for the live generator state a recompute of a
    random node puts aside (charged in every node's transient, allocated only while one runs)."""
    model, x = small_model(width=64)
    model, x = model.to(device), x.to(device)
    captured = capture(model, [x], granularity=granularity)
    rm = Rematerialized(model, captured, keep_schedule(captured, keep_every))
    measured = measured_step_peak(rm, [x], lambda out: out.backward(torch.ones_like(out)), device)
    state = generator(torch.device(device)).get_state().nbytes
    assert rm.predicted_peak_bytes - state <= measured <= rm.predicted_peak_bytes


@pytest.fixture(scope="module")
def gpt_captured():
    from graph_capture.models.demo_models import gpt

    model, inputs = gpt()
    return model, inputs, capture(model, inputs)


@pytest.mark.parametrize(("keep_every", "compiled"), [(3, True), (3, False), (0, True)])
def test_demo_gpt_measured_peak_is_the_predicted_peak(gpt_captured, keep_every, compiled, device):
    """Peaks in the backward slice too: a value the schedule frees there must be released."""
    model, inputs, captured = gpt_captured
    if device != "cpu":  # the fixture's capture is on the CPU
        model, inputs = copy.deepcopy(model).to(device), tuple(x.to(device) for x in inputs)
        captured = capture(model, inputs)
    schedule = keep_schedule(captured, keep_every)
    rm = Rematerialized(copy.deepcopy(model), captured, schedule, compiled=compiled)
    measured = measured_step_peak(rm, inputs, lambda loss: loss.backward(), device)
    state = generator(torch.device(device)).get_state().nbytes
    assert schedule.peak - state <= measured <= schedule.peak


def test_demo_gpt_measured_peak_within_a_solved_byte_budget(gpt_captured):
    model, inputs, captured = gpt_captured
    full = solver.checkpoint_all_peak(prepare(captured.dag))
    budget = int(0.6 * full)
    schedule = solver.solve(captured.dag, budget=budget, time_limit=5)
    rm = Rematerialized(copy.deepcopy(model), captured, schedule)
    measured = measured_step_peak(rm, inputs, lambda loss: loss.backward())
    assert measured <= budget
    assert measured <= 1.03 * schedule.peak


class DictOutputs(nn.Module):
    """Several inputs; outputs in a dict, one of them not differentiable."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(8, 8), nn.Linear(8, 4), nn.Dropout(0.3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.drop(torch.relu(self.a(x)))
        return {"out": self.b(h) + y.sum(), "aux": h.mean(), "idx": h.argmax(-1)}


def test_pytree_outputs_and_non_differentiable_outputs_match_eager():
    torch.manual_seed(0)
    model, x, y = DictOutputs().train(), torch.randn(5, 8), torch.randn(3)
    captured = capture(copy.deepcopy(model), [x, y])
    eager, remat_model = copy.deepcopy(model), copy.deepcopy(model)
    rm = Rematerialized(remat_model, captured, keep_schedule(captured, 0))
    outs = []
    for module in (eager, rm):
        torch.manual_seed(1)
        out = module(x, y)
        (out["out"].square().sum() + out["aux"]).backward()
        outs.append(out)
    assert set(outs[1]) == {"out", "aux", "idx"} and not outs[1]["idx"].requires_grad
    for key in outs[0]:
        assert torch.equal(outs[0][key], outs[1][key])
    for a, b in zip(eager.parameters(), remat_model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_a_second_backward_through_one_step_is_a_backward_error(captured_small):
    model, x, captured = captured_small
    rm = Rematerialized(model, captured, keep_schedule(captured, 1))
    loss = rm(x).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(executor.BackwardError, match="retain_graph=True is not supported") as info:
        loss.backward()
    assert isinstance(info.value, RuntimeError)
