"""Bad input to SAC plans gets a clear error: budgets, block patterns, plan files for another
model or other blocks, a block whose op stream changed, a model that fails eagerly."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time

import pytest
import torch
from sac_models import (
    Net,
    assert_same_adamw_steps,
    every_saveable,
    mlp_net,
    replanned,
    sum_loss,
    transformer,
)

import executor
from executor import PlanError
from solver.errors import InfeasibleBudgetError, ScheduleMismatchError, SolverTimeoutError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def solved():
    net = mlp_net(layers=2)
    x = torch.randn(32, 32)
    return net, x, executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss)


def test_budget_below_the_least_names_it(solved):
    net, x, plan = solved
    with pytest.raises(InfeasibleBudgetError, match=f"least predicted peak .* is {plan.peak}"):
        executor.checkpoint_plan(net, (x,), plan.peak - 1, time_limit=60, loss_fn=sum_loss)


@pytest.mark.parametrize("budget", ["lots", "0.5", "-3%x"])
def test_unreadable_budget(solved, budget):
    net, x, _ = solved
    with pytest.raises(ValueError, match=r"cannot read memory budget|whole number of bytes"):
        executor.checkpoint_plan(net, (x,), budget, loss_fn=sum_loss)


def test_block_pattern_matching_nothing(solved):
    net, x, _ = solved
    with pytest.raises(PlanError, match=r"no module of Net matches block 'layers\.\*'"):
        executor.checkpoint_plan(net, (x,), "80%", blocks=["layers.*"], loss_fn=sum_loss)


def test_model_failing_eagerly_raises_its_own_error(solved):
    net, _, _ = solved
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        executor.checkpoint_plan(net, (torch.randn(4, 7),), "80%", loss_fn=sum_loss)


def test_plan_file_round_trips_and_refuses_another_model(solved, tmp_path):
    net, _, plan = solved
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = executor.CheckpointPlan.load(path, net)
    assert (loaded.checkpointed, loaded.saved) == (plan.checkpointed, plan.saved)
    assert loaded.peak == plan.peak and loaded.ops == plan.ops
    assert loaded.model_signature == plan.model_signature and loaded.regions == plan.regions
    with pytest.raises(ScheduleMismatchError, match="solved for another model"):
        executor.CheckpointPlan.load(path, mlp_net(layers=3))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(PlanError, match="is not a SAC plan file"):
        executor.CheckpointPlan.load(tmp_path / "bad.json", net)
    old = json.loads(path.read_text()) | {"format": "remat-sac-plan/4"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(PlanError, match=r"format 'remat-sac-plan/4'.*solve it again"):
        executor.CheckpointPlan.load(tmp_path / "old.json", net)
    assert all("price" in b for b in json.loads(path.read_text())["problem"]["blocks"]["blocks"])


def test_plan_for_other_blocks_is_refused(solved):
    net, x, _ = solved
    plan = executor.checkpoint_plan(
        net, (x,), "100%", blocks=["blocks.*.fc1"], time_limit=60, loss_fn=sum_loss
    )
    changed = copy.deepcopy(net)
    changed.blocks[0].fc1.__class__ = type("OtherLinear", (torch.nn.Linear,), {})
    with pytest.raises(
        ScheduleMismatchError, match=r"region blocks\.0\.fc1 .* not a module of this"
    ):
        plan.apply(changed)


def test_changed_op_stream_is_refused_at_its_first_step(solved):
    """A region saving an op runs under its policy, which checks the op stream; one saving none
    runs as plain checkpoint, which has no per-op decision to get wrong, and runs."""
    net, x, plan = solved
    only = tuple(name == "blocks.0" for name in plan.regions)
    plain = dataclasses.replace(plan, checkpointed=only, saved=(frozenset(),) * len(only))
    saving, _ = replanned(plain, every_saveable(plain))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain.apply(copy.deepcopy(net))(x).sum().backward()
    model = saving.apply(copy.deepcopy(net))
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(
            executor.OpStreamMismatchError, match=r"block blocks\.0 dispatched .* at op \d+"
        ),
    ):
        model(x)


def test_applying_twice_is_refused(solved):
    net, _, plan = solved
    model = plan.apply(copy.deepcopy(net))
    with pytest.raises(PlanError, match="apply it once"):
        plan.apply(model)


def test_blocks_given_as_one_string_is_refused():
    with pytest.raises(PlanError, match="list of names or patterns"):
        executor.checkpoint_plan(
            transformer(1), (torch.randn(2, 4, 32),), "80%", blocks="blocks.0", loss_fn=sum_loss
        )


def test_t5_without_decoder_start_token_raises_the_models_own_error():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        num_layers=1, d_model=16, d_kv=8, num_heads=2, d_ff=32, vocab_size=64, pad_token_id=0
    )
    config.decoder_start_token_id = None
    model = transformers.T5ForConditionalGeneration(config).train()
    ids = torch.randint(0, 64, (2, 8))
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        executor.checkpoint_plan(model, (ids,), "80%", example_kwargs={"labels": ids})


def test_a_deep_copy_of_a_planned_model_runs_its_own_weights(solved):
    net, x, plan = solved
    planned = copy.deepcopy(plan.apply(copy.deepcopy(net)))
    with torch.no_grad():
        for p in planned.parameters():
            p.mul_(0.5)
    plain = copy.deepcopy(net)
    with torch.no_grad():
        for p in plain.parameters():
            p.mul_(0.5)
    torch.manual_seed(0)
    a = planned(x)
    torch.manual_seed(0)
    assert torch.equal(a, plain(x))


class _WritesItsInput(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.relu_())


def test_block_that_fails_inside_checkpoint_is_refused():
    """A block writing its input in place runs plainly but not inside checkpoint, which keeps
    that input for the recompute."""
    net = Net([_WritesItsInput(32), _WritesItsInput(32)], 32)
    with pytest.raises(
        PlanError, match=r"block blocks\.0 fails inside torch\.utils\.checkpoint .*inplace"
    ) as info:
        executor.checkpoint_plan(
            net, (torch.randn(4, 32),), "80%", regions="blocks", time_limit=60, loss_fn=sum_loss
        )
    assert isinstance(info.value.__cause__, RuntimeError), "the cause should be chained"


def test_out_of_memory_while_pricing_propagates(solved, monkeypatch):
    """Only autograd's and checkpoint's refusals of a region make it no region."""
    net, x, _ = solved

    def out_of_memory(*_args, **_kwargs):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr("executor.sac.recording.region_timing.region_times", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss)


def test_a_model_on_the_meta_device_without_a_target_is_refused_before_recording():
    """Measured mode records a real step, on the CPU or one CUDA device."""
    net = transformer(layers=2).to("meta")
    with pytest.raises(PlanError, match=r"measures on the CPU or a CUDA device.*meta"):
        executor.checkpoint_plan(
            net, (torch.randn(2, 8, 32, device="meta"),), "50%", loss_fn=sum_loss
        )


def test_the_time_limit_bounds_the_recording_and_names_what_it_needs():
    """`time_limit` covers the whole call: a limit the first plain step alone exceeds ends the
    recording there with what it recorded and the time it needs."""
    net, x = transformer(layers=2), torch.randn(4, 16, 32)
    began = time.perf_counter()
    with pytest.raises(
        PlanError, match=r"out of time_limit=0.01 s .* recorded a plain step.*"
    ) as info:
        executor.checkpoint_plan(net, (x,), "min", time_limit=0.01, loss_fn=sum_loss)
    assert time.perf_counter() - began < 0.01 * 1.05 + 0.5 + 10  # generous: a shared machine
    assert re.search(r"needs about \d+ s.*give time_limit=\d+", str(info.value)), info.value


def test_a_solve_the_recording_left_too_little_time_says_what_time_limit_to_give():
    """A solve that finds no plan before the call's deadline: its SolverTimeoutError names
    the recording's seconds and a time_limit above both twice that and the one given."""
    from executor.sac.step import RecordingTime
    from solver.deadline import Deadline

    clock = RecordingTime(time_limit=0.5, deadline=Deadline.after(0.5))
    clock.began -= 0.4  # the recording took 0.4 s
    with pytest.raises(SolverTimeoutError) as info, clock.solving():
        raise SolverTimeoutError("no SAC plan found within the time limit", cost_bound=3.0)
    message = str(info.value)
    assert re.search(r"time_limit=0.5 s: the recording took 0.4 s .* give time_limit=2 or", message)
    assert info.value.cost_bound == 3.0
    with pytest.raises(SolverTimeoutError, match=r"^no SAC plan"), RecordingTime().solving():
        raise SolverTimeoutError("no SAC plan found within the time limit")  # no time_limit


@pytest.mark.parametrize("limit", [0.5, 2.0])
def test_a_short_time_limit_returns_a_plan_in_time_or_says_what_it_needs(limit):
    """Measurements repeat only while time is left: the call returns within its limit (with
    the solver's margin and a generous one for a loaded machine) or raises the recording's
    PlanError, or the solve's SolverTimeoutError where the recording left it too little (a
    loaded machine at 0.5 s), each saying what time_limit to give; the plan it returns is
    exact."""
    net, x = transformer(layers=2), torch.randn(4, 16, 32)
    began = time.perf_counter()
    try:
        plan = executor.checkpoint_plan(net, (x,), "min", time_limit=limit, loss_fn=sum_loss)
    except (PlanError, SolverTimeoutError) as error:
        assert "give time_limit=" in str(error)
    else:
        runs = [copy.deepcopy(net), plan.apply(copy.deepcopy(net))]
        assert_same_adamw_steps(runs, lambda model, step: model(x + step).sum())
    assert time.perf_counter() - began < limit * 1.05 + 0.5 + 10
