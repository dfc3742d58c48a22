"""SAC plans that offload saved ops to the host (`checkpoint_plan(offload=)`, docs/sac.md
"Offload"): gradients `torch.equal` to eager's over 3 AdamW steps with the plan's regions
offloading every op they may and with the planner's own choice; the measured device peak (host
copies told apart, `executor.sac.runtime.offload.measure_split`) within the predicted peak and the
measured host bytes equal to the predicted ones; plan files carry the choices and format 5
files still load; torch.compile refuses an offloading plan in one line."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sac_models import (
    MLP,
    Attention,
    Net,
    assert_same_adamw_steps,
    every_saveable,
    mlp_net,
    replanned,
    sum_loss,
    transformer,
)
from test_sac_state import cnn

import executor
from executor.errors import PlanError
from executor.sac.runtime.offload import measure_split
from executor.traced.offload import link_on
from graph_capture.measurement.peak import CPU
from solver.core.link import Link
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError
from solver.sac.memory import offloadable, plain_offload_bytes
from solver.sac.solve import solve_sac
from solver.sac.union import UnionPlan, union_host
from solver.target.devices import HOST_LINKS, UnknownTargetError

pytestmark = pytest.mark.usefixtures("one_thread")

LINK = link_on(HOST_LINKS["pcie5"], CPU)  # its host rounding here: the CPU's clones, exact


def regions_of(plan: executor.CheckpointPlan) -> list:
    """The plan's candidate regions' `SacBlock`s in `plan.regions` order."""
    return plan.problem.regions()


def every_offloadable(plan: executor.CheckpointPlan, saved) -> tuple[frozenset[int], ...]:
    return tuple(
        frozenset(i for i in s if offloadable(r.ops[i]))
        for r, s in zip(regions_of(plan), saved, strict=True)
    )


def every_plain(plan: executor.CheckpointPlan) -> tuple[bool, ...]:
    """Per region (`plan.regions` order): whether it may offload its saved storages (not
    checkpointed, saving some, a block without children or a child of a block not
    checkpointed whole), and so does."""
    out = []
    for block, split in zip(plan.problem.blocks.blocks, plan.problem.splits, strict=True):
        k = len(out)
        out.append(split is None and not plan.checkpointed[k] and plain_offload_bytes(block) > 0)
        for i, child in enumerate(split.children if split is not None else ()):
            ok = not plan.checkpointed[k] and not plan.checkpointed[k + 1 + i]
            out.append(ok and plain_offload_bytes(child) > 0)
    return tuple(out)


def measured(model, step) -> tuple[int, int]:
    """(device, host) peak bytes of one step after a warm-up step."""
    step(model)
    model.zero_grad(set_to_none=True)
    split = measure_split(lambda: step(model))
    model.zero_grad(set_to_none=True)
    return split.device_peak, split.host_peak


def flat(plan: UnionPlan) -> list[tuple[bool, frozenset[int], frozenset[int], bool]]:
    """(checkpointed, saved, offloaded, plain-offloaded) per region, blocks followed by their
    children."""
    out = []
    for j, sub in enumerate(plan.children):
        b = plan.blocks
        out.append((b.checkpointed[j], b.saved[j], b.offloads()[j], b.plain_offloads()[j]))
        if sub is not None:
            out += zip(
                sub.checkpointed, sub.saved, sub.offloads(), sub.plain_offloads(), strict=True
            )
    return out


def sum_step(x):
    return lambda m: m(x).sum().backward()


def hf_gpt2():
    pytest.importorskip("transformers")
    from graph_capture.models.hf_models import gpt2_lm

    torch.manual_seed(0)
    model, args, kwargs = gpt2_lm(batch=2, seq=16, layers=2, width=32)
    kwargs["use_cache"] = False
    return model, args, kwargs


CASES = {
    "transformer": lambda: (transformer(), (torch.randn(4, 32, 32),), None),
    "mlp-inplace-relu": lambda: (mlp_net(inplace=True), (torch.randn(4, 32, 32),), None),
    "batchnorm-cnn": lambda: (cnn(0.1), (torch.randn(2, 3, 8, 8),), None),
    "hf-gpt2": hf_gpt2,
}


@pytest.mark.parametrize("case", list(CASES))
def test_offloading_every_saved_op_is_exact_and_within_its_prediction(case):
    model, args, kwargs = CASES[case]()
    loss_fn = sum_loss if kwargs is None else executor.default_loss
    plan = executor.checkpoint_plan(
        model, args, "min", example_kwargs=kwargs, time_limit=60, loss_fn=loss_fn, offload="h100"
    )
    assert plan.link == LINK
    saved = every_saveable(plan)
    offloaded = every_offloadable(plan, saved)
    plain = every_plain(plan)
    assert any(offloaded) or any(plain), "the plan's regions should have ops to offload"
    offloading, peak = replanned(plan, saved, offloaded, plain)
    host = union_host(plan.problem, offloading.union_plan())
    keeping, _ = replanned(plan, saved)

    def step(m):
        loss_fn(m(*args, **(kwargs or {}))).backward()

    device_bytes, host_bytes = measured(offloading.apply(copy.deepcopy(model)), step)
    print(f"{case}: device {device_bytes} B of predicted {peak} B; host {host_bytes} B of {host} B")
    assert device_bytes <= peak
    assert host_bytes == host > 0
    runs = [copy.deepcopy(model), offloading.apply(copy.deepcopy(model))]
    runs.append(keeping.apply(copy.deepcopy(model)))
    assert_same_adamw_steps(runs, lambda m, _: loss_fn(m(*args, **(kwargs or {}))))


@settings(max_examples=3, derandomize=True, deadline=None)
@given(
    layers=st.integers(2, 3),
    d=st.sampled_from([16, 32]),
    inplace=st.booleans(),
    attention=st.booleans(),
    where=st.floats(0, 1),
)
def test_drawn_models_and_budgets_offload_exactly_within_the_prediction(
    layers, d, inplace, attention, where
):
    """Drawn MLP or attention nets at a drawn budget from their least peak with offload to
    their plain step: the plan within the budget; the plan's regions offloading every op they
    may and parking every region that may: gradients `torch.equal` to eager's over 3 AdamW
    steps, device peak within the prediction, host bytes as predicted."""
    torch.manual_seed(layers + d)
    blocks = [Attention(d) if attention else MLP(d, 3 * d, 0.1, inplace) for _ in range(layers)]
    net, x = Net(blocks, d).train(), torch.randn(4, 24, d)
    least = executor.checkpoint_plan(
        net, (x,), "min", time_limit=60, loss_fn=sum_loss, offload=LINK
    )
    budget = int(least.peak + where * (least.plain_peak - least.peak))
    plan = executor.checkpoint_plan(
        net, (x,), budget, time_limit=60, loss_fn=sum_loss, offload=LINK
    )
    device_bytes, host_bytes = measured(plan.apply(copy.deepcopy(net)), sum_step(x))
    assert (
        device_bytes <= plan.budget and device_bytes <= plan.peak and host_bytes == plan.host_peak
    )
    saved = every_saveable(plan)
    every, peak = replanned(plan, saved, every_offloadable(plan, saved), every_plain(plan))
    host = union_host(plan.problem, every.union_plan())
    device_bytes, host_bytes = measured(every.apply(copy.deepcopy(net)), sum_step(x))
    assert device_bytes <= peak and host_bytes == host
    runs = [copy.deepcopy(net), every.apply(copy.deepcopy(net)), plan.apply(copy.deepcopy(net))]
    assert_same_adamw_steps(runs, lambda m, _: m(x).sum())


@pytest.mark.parametrize("above_least", [1.0, 1.15])
def test_the_planner_offloads_where_recompute_costs_more(above_least):
    """The recorded problem with every region's SAC overhead and checkpoint price, and the
    runtime's price per offloaded op, 0 (so a copy over PCIe Gen5, a fraction of a microsecond
    here, beats rerunning an op whatever the machine's load): its optimum offloads, runs exact
    and within the budget and prediction. Budgets: the least peak and 15% above it, in bytes
    of the plan's own recording (a percentage is of the measured plain step, whose bytes
    depend on what the process ran before)."""
    net, x = transformer(), torch.randn(4, 32, 32)
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss)
    if above_least != 1.0:
        budget = int(above_least * plan.budget)
        plan = executor.checkpoint_plan(net, (x,), budget, time_limit=60, loss_fn=sum_loss)
    problem = plan.problem
    free = dataclasses.replace(
        problem,
        blocks=dataclasses.replace(
            problem.blocks,
            blocks=tuple(
                dataclasses.replace(b, overhead=0.0, price=0.0) for b in problem.blocks.blocks
            ),
        ),
        splits=tuple(
            None
            if s is None
            else dataclasses.replace(
                s,
                children=tuple(dataclasses.replace(c, overhead=0.0, price=0.0) for c in s.children),
            )
            for s in problem.splits
        ),
    )
    solution = solve_sac(free, plan.budget, Deadline.after(10), link=LINK)
    keep = solve_sac(free, plan.budget, Deadline.after(10))
    assert solution.cost < keep.cost
    checkpointed, saved, offloaded, plain = (
        tuple(x) for x in zip(*flat(solution.plan), strict=True)
    )
    assert any(offloaded) or any(plain)
    chosen = dataclasses.replace(
        plan,
        checkpointed=checkpointed,
        saved=saved,
        offloaded=offloaded if any(offloaded) else None,
        plain_offloaded=plain if any(plain) else None,
        link=LINK,
    )
    device_bytes, host_bytes = measured(chosen.apply(copy.deepcopy(net)), sum_step(x))
    assert device_bytes <= solution.peak <= plan.budget
    assert host_bytes == solution.host_peak
    runs = [copy.deepcopy(net), chosen.apply(copy.deepcopy(net))]
    assert_same_adamw_steps(runs, lambda m, _: m(x).sum())


def test_only_offload_fits_a_budget_below_the_least_peak_without_it():
    """The in-place-ReLU MLP net's least peak with offload (regions not checkpointed parking
    their saved storages on the host) is below its least peak without: at that budget
    checkpoint_plan without offload= is refused, with it the plan offloads, runs within the
    budget with the host bytes predicted, and its gradients are eager's bit for bit."""
    net, x = mlp_net(inplace=True), torch.randn(4, 32, 32)
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss, offload=LINK)
    with pytest.raises(InfeasibleBudgetError):
        executor.checkpoint_plan(net, (x,), plan.budget, time_limit=60, loss_fn=sum_loss)
    assert any(plan.plain_offloads()) or any(plan.offloads())
    device_bytes, host_bytes = measured(plan.apply(copy.deepcopy(net)), sum_step(x))
    print(f"only offload: device {device_bytes} B, budget {plan.budget} B, host {host_bytes} B")
    assert device_bytes <= plan.budget and host_bytes == plan.host_peak > 0
    runs = [copy.deepcopy(net), plan.apply(copy.deepcopy(net))]
    assert_same_adamw_steps(runs, lambda m, _: m(x).sum())


def test_parked_regions_leave_their_output_on_the_device_and_off_the_host():
    """ResNet blocks in torchvision's layout end in an in-place ReLU, which saves its result:
    the block's output, whose storage (the last BatchNorm's) autograd saves inside the region.
    Every block parked: the host holds each block's saved storages but never its output's (it
    stays on the device; NOTE [ SAC offload model ]), so the measured host bytes are the
    predicted ones to the byte, also while the last block's forward runs; gradients, losses and
    buffers `torch.equal` to eager's."""
    from benchmarks.zoo import resnet18

    model, (images, labels) = resnet18(batch=2, image=16, classes=4, width=4)
    plan = executor.checkpoint_plan(
        model, (images, labels), "min", time_limit=60, loss_fn=lambda loss: loss, offload=LINK
    )
    none = tuple(frozenset() for _ in plan.regions)
    bare = dataclasses.replace(plan, checkpointed=(False,) * len(plan.regions), saved=none)
    parking, _ = replanned(bare, none, None, every_plain(bare))
    assert all(parking.plain_offloads())
    host = union_host(plan.problem, parking.union_plan())
    ends_saved = [r.ops[-1].name == "aten.relu_.default" for r in regions_of(plan)]
    assert all(ends_saved) and host > 0
    _, host_bytes = measured(
        parking.apply(copy.deepcopy(model)), lambda m: m(images, labels).backward()
    )
    assert host_bytes == host
    runs = [copy.deepcopy(model), parking.apply(copy.deepcopy(model))]
    assert_same_adamw_steps(runs, lambda m, _: m(images, labels))


def test_plan_files_carry_the_offload_and_format_5_files_load(tmp_path):
    net, x = transformer(layers=2, d=16), torch.randn(2, 8, 16)
    link = Link(1e9, 2e9, 1 << 20)
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss, offload=link)
    saved = every_saveable(plan)
    offloading, _ = replanned(plan, saved, every_offloadable(plan, saved), every_plain(plan))
    assert any(offloading.offloads()) or any(offloading.plain_offloads())
    path = tmp_path / "plan.json"
    offloading.save(path)
    loaded = executor.CheckpointPlan.load(path, net)
    assert (loaded.link, loaded.host_peak) == (link, plan.host_peak)
    assert loaded.offloads() == offloading.offloads()
    assert loaded.plain_offloads() == offloading.plain_offloads()
    assert "regions offloaded" in repr(loaded)
    data = json.loads(path.read_text())
    data["host"] = data.pop("host_peak")  # `host`, the key format-6 files may hold instead
    path.write_text(json.dumps(data))
    assert executor.CheckpointPlan.load(path, net).host_peak == loaded.host_peak > 0
    data["format"] = "remat-sac-plan/5"  # what format 5 wrote: no link, no offload choices
    for key in ("link", "host"):
        del data[key]
    for region in data["regions"]:
        del region["offloaded"], region["plain_offloaded"]
    path.write_text(json.dumps(data))
    old = executor.CheckpointPlan.load(path, net)
    assert (old.link, old.offloaded, old.plain_offloaded, old.host_peak) == (None, None, None, 0)
    assert old.saved == offloading.saved
    data["format"] = "remat-sac-plan/4"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="solve it again"):
        executor.CheckpointPlan.load(path, net)


def test_compile_refuses_offloaded_ops_and_runs_offloaded_regions_through_graph_breaks():
    """Offloaded MUST_SAVE ops: torch.compile is refused (the plan's one-line PlanError inside
    torch's BackendCompilerFailed). Regions parking their saved storages run eagerly between
    the compiled pieces, their hooks parking what they save; gradients allclose to eager's."""
    net, x = transformer(layers=2, d=16), torch.randn(2, 8, 16)
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss)
    plan = dataclasses.replace(plan, link=LINK)
    saved = every_saveable(plan)
    offloading, _ = replanned(plan, saved, every_offloadable(plan, saved))
    assert any(offloading.offloads())
    torch._dynamo.reset()
    compiled = torch.compile(offloading.apply(copy.deepcopy(net)), backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as raised:
        compiled(x).sum().backward()
    # torch wraps what its backend raises; the cause is the plan's one line
    assert isinstance(raised.value.inner_exception, PlanError)
    assert "torch.compile cannot run in torch 2.13" in str(raised.value.inner_exception)
    none = tuple(frozenset() for _ in plan.regions)
    bare = dataclasses.replace(plan, checkpointed=(False,) * len(plan.regions), saved=none)
    parking, _ = replanned(bare, none, None, every_plain(bare))
    assert any(parking.plain_offloads())
    torch._dynamo.reset()
    compiled = torch.compile(parking.apply(copy.deepcopy(net)), backend="aot_eager")
    eager = copy.deepcopy(net)
    for model in (compiled, eager):
        torch.manual_seed(0)
        model(x).sum().backward()
    for a, b in zip(compiled.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    _, host_bytes = measured(compiled, sum_step(x))
    assert host_bytes > 0  # the parked regions' hooks ran


def test_offload_arguments_are_checked():
    net, x = transformer(layers=2, d=16), torch.randn(2, 8, 16)
    plain = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss)
    assert (plain.link, plain.offloaded, plain.host_peak) == (None, None, 0)
    with pytest.raises(PlanError, match="offload must be"):
        executor.checkpoint_plan(net, (x,), "min", loss_fn=sum_loss, offload=64e9)
    with pytest.raises(UnknownTargetError):
        executor.checkpoint_plan(net, (x,), "min", loss_fn=sum_loss, offload="pcie9")
    with pytest.raises(PlanError, match="sharded"):
        executor.checkpoint_plan(
            net, (x,), "min", loss_fn=sum_loss, offload="h100", target="h100", world_size=2
        )
