"""SAC plans in estimate mode (`checkpoint_plan(..., target=...)`,
executor/sac/recording/estimate.py): the recording under fake tensors gives the measured
recording's regions, op streams and op bytes; a plan made from a meta model runs on the real model
with gradients and buffers `torch.equal` to eager; bad input is refused in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from sac_models import assert_same_adamw_steps, every_saveable, replanned, sum_loss, transformer
from torch import nn

import executor
from cli.main import main
from executor.errors import PlanError
from solver.target import UnknownTargetError

pytestmark = pytest.mark.usefixtures("one_thread")


def _op_facts(plan: executor.CheckpointPlan) -> list:
    """Per region: its stop, held bytes, buffers, and each op's name, new and saved bytes."""
    regions = []
    for block, split in zip(plan.problem.blocks.blocks, plan.problem.splits, strict=True):
        regions += [block, *(split.children if split is not None else ())]
    return [
        (r.stop, r.held_extra, r.buffers, [(o.name, o.new_bytes, o.saved_bytes) for o in r.ops])
        for r in regions
    ]


def test_estimated_recording_has_the_measured_regions_streams_and_bytes():
    net, x = transformer(layers=2, d=16), torch.randn(2, 8, 16)
    measured = executor.checkpoint_plan(net, (x,), "min", loss_fn=sum_loss, time_limit=60)
    estimated = executor.checkpoint_plan(
        net, (x,), "min", loss_fn=sum_loss, time_limit=60, target="cpu"
    )
    assert estimated.target == "cpu" and "predicted for cpu" in repr(estimated)
    assert measured.target is None and "measured" in repr(measured)
    assert estimated.regions == measured.regions and estimated.ops == measured.ops
    assert _op_facts(estimated) == _op_facts(measured)  # no op of this net has a workspace
    # the plain step's windows: the measured ones add kernel scratch (8 B per block here)
    assert 0 <= measured.plain_peak - estimated.plain_peak <= 0.01 * measured.plain_peak


def _gpt2(device: str):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=16)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, ids.to(device)


def test_plan_from_a_meta_model_runs_exactly_on_the_real_model(tmp_path):
    meta, meta_ids = _gpt2("meta")
    kwargs = {"labels": meta_ids, "use_cache": False}
    plan = executor.checkpoint_plan(
        meta, (meta_ids,), "min", example_kwargs=kwargs, time_limit=60, target="cpu"
    )
    assert plan.checkpointed_regions()
    # every region saving every op it may: positions must mean the real run's ops (under fake
    # tensors alone HF builds an explicit causal mask and the stream diverges at op 11)
    plan, predicted = replanned(plan, every_saveable(plan))
    plan.save(tmp_path / "plan.json")
    model, ids = _gpt2("cpu")
    loaded = executor.CheckpointPlan.load(tmp_path / "plan.json", model)
    runs = [copy.deepcopy(model), loaded.apply(copy.deepcopy(model))]
    real = {"labels": ids, "use_cache": False}
    first = executor.measure_peak(lambda: runs[1](ids, **real).loss.backward()).peak_bytes
    runs[1].zero_grad(set_to_none=True)
    assert abs(first - predicted) <= 0.01 * predicted  # measured 447,424 B, predicted 447,504 B
    assert_same_adamw_steps(runs, lambda m, _: m(ids, **real).loss, steps=2)


def test_plan_on_a_batchnorm_cnn_restores_its_statistics_exactly():
    from benchmarks.zoo import resnet18

    bench = resnet18(batch=2, image=16, classes=4, width=8)
    model, inputs = bench
    plan = executor.checkpoint_plan(model, inputs, "min", time_limit=60, target="cpu")
    measured = executor.checkpoint_plan(model, inputs, "min", time_limit=60)
    assert [r.buffers for r in plan.problem.blocks.blocks] == [
        r.buffers for r in measured.problem.blocks.blocks
    ]
    plan, _ = replanned(plan, every_saveable(plan))
    runs = [copy.deepcopy(model), plan.apply(copy.deepcopy(model))]
    assert_same_adamw_steps(runs, lambda m, _: m(*inputs), steps=2)


class _Block(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.lin, self.kind = nn.Linear(8, 8), kind
        self.scale = torch.ones(8)  # a plain attribute: real memory, not a buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.kind == "masked_select":
            return y + y.masked_select(y > 0).sum()
        if self.kind == "nonzero":
            return y * y.nonzero().shape[0]
        return y * self.scale


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("nonzero", "data-dependent output shape"),
        ("masked_select", "data-dependent output shape"),
        ("attribute", "real cpu tensor"),
    ],
)
def test_estimate_mode_refuses_what_it_cannot_predict(kind, message):
    net = nn.Sequential(_Block(kind), _Block(kind))
    x = torch.randn(2, 8)
    with pytest.raises(PlanError, match=message):
        executor.checkpoint_plan(net, (x,), "min", loss_fn=sum_loss, target="cpu")


def test_unknown_target_is_refused(capsys):
    net, x = transformer(layers=2, d=16), torch.randn(2, 8, 16)
    with pytest.raises(UnknownTargetError, match="unknown target 'tpu9'"):
        executor.checkpoint_plan(net, (x,), "min", loss_fn=sum_loss, target="tpu9")
    assert main(["sac", "--model", "sac_models:small", "--target", "tpu9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat: error: unknown target 'tpu9'") and err.count("\n") == 1


def test_remat_sac_plans_for_a_target_and_runs_the_plan(capsys):
    args = ["sac", "--model", "sac_models:small", "--target", "cpu", "--budget", "min"]
    assert main([*args, "--steps", "1", "--time-limit", "60"]) == 0
    printed = capsys.readouterr().out
    assert "(predicted for cpu)" in printed and "bytes over budget: 0" in printed


def test_identical_blocks_recorded_once_give_the_plan_of_recording_each(monkeypatch):
    """Estimate mode records the first region of each kind (executor/sac/recording/alike.py) and
    gives its facts to the others: the recorded problem (every op's bytes and seconds, every window)
    and so the plan equal those of recording every region."""
    transformers = pytest.importorskip("transformers")
    from executor.sac.recording.estimate import Estimate

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).train()
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    plans = {}
    for alike in (True, False):
        monkeypatch.setattr(Estimate, "records_alike", alike)
        plans[alike] = executor.checkpoint_plan(
            model, (ids,), "70%", example_kwargs={"labels": ids, "use_cache": False},
            target="h100", time_limit=60,
        )  # fmt: skip
    reused, each = plans[True], plans[False]
    assert reused.problem == each.problem
    assert (reused.regions, reused.ops) == (each.regions, each.ops)
    assert len(reused.regions) == 4 * 5  # the 4 layers and their 4 children each
    # the optimum is tied over which of the identical layers are checkpointed: equal cost (up
    # to the order its floats are summed in)
    assert reused.cost == pytest.approx(each.cost, rel=1e-12)
    assert reused.status == each.status == "OPTIMAL"
    assert max(reused.peak, each.peak) <= reused.budget == each.budget


class _Layer(nn.Module):
    """A layer whose op stream depends on an attribute, not on its parameters or inputs."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.lin, self.twice = nn.Linear(8, 8), twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.lin(x))
        return torch.tanh(x) if self.twice else x


def test_blocks_alike_in_class_parameters_and_inputs_but_not_ops_are_each_recorded():
    net = nn.Sequential(_Layer(False), _Layer(False), _Layer(True))
    plan = executor.checkpoint_plan(
        net, (torch.randn(4, 8),), "min", loss_fn=sum_loss, time_limit=60, target="cpu"
    )
    ops = dict(zip(plan.regions, plan.ops, strict=True))
    assert ops["0"] == ops["1"] and ops["2"] == (*ops["0"], "aten.tanh.default")
