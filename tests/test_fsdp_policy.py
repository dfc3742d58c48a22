"""One FSDP policy for `fit` and `checkpoint_plan` (NOTE [ one FSDP policy ] in
executor/fsdp.py): `fsdp=` takes a `solver.target.FsdpPolicy` in both, a mapping is refused in
one line; without one both make the same default (`executor.fsdp_policy`); a model's groups
count a parameter that several blocks hold once, in the first block (forward order)."""

from __future__ import annotations

import pytest
import torch
from sac_models import sum_loss, transformer
from test_fit_fsdp import MEMORY, TOY, WIDTH, meta_blocks

import executor
from executor.errors import FitError, PlanError
from executor.fsdp import model_memory, resolve_policy
from solver.target import Device, FsdpPolicy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_mapping_is_refused_in_one_line_by_fit_and_plan():
    with pytest.raises(FitError, match=r"fsdp= takes an FsdpPolicy, not dict") as fit_error:
        executor.fit(meta_blocks, MEMORY, target=TOY, world_size=2, fsdp={"backend": "gloo"})
    with torch.device("meta"):
        net, x = transformer(layers=2, d=16), torch.empty(2, 4, 16)
    with pytest.raises(PlanError, match=r"fsdp= takes an FsdpPolicy, not dict") as plan_error:
        executor.checkpoint_plan(
            net, (x,), "min", loss_fn=sum_loss, target=TOY, fsdp={"backend": "gloo"}
        )
    assert str(fit_error.value) == str(plan_error.value)
    assert "\n" not in str(fit_error.value) and "executor.fsdp_policy(" in str(fit_error.value)


def test_fit_takes_the_policy_and_its_default_is_the_one_default():
    given = executor.fsdp_policy(2, TOY)
    with_policy = executor.fit(meta_blocks, MEMORY, target=TOY, fsdp=given, time_limit=30)
    default = executor.fit(meta_blocks, MEMORY, target=TOY, world_size=2, time_limit=30)
    assert with_policy.fsdp == default.fsdp and with_policy.size == default.size
    assert with_policy.fsdp.world_size == 2


def test_one_default_for_every_caller():
    """float32 master weights, the model's dtype gathered, the target's rounding, the
    collectives and step counters of its kind of device."""
    with torch.device("meta"):
        half = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert resolve_policy(half, 2, None, TOY) == FsdpPolicy(
        2, "float32", "bfloat16", rounding=1, backend="nccl"
    )
    cpu = Device("cpu", {"float32": 1e11}, 1e10, 1 << 30, rounding=1, kernels="cpu")
    assert resolve_policy(half, 2, None, cpu).backend == "gloo"
    assert resolve_policy(half, 2, None, cpu).step_counters_on_device
    assert resolve_policy(half, 2, None, None) == executor.fsdp_policy(2, param_dtype="bfloat16")
    assert executor.fsdp_policy(4, "h100").rounding == 512


def test_bf16_model_default_is_float32_master_weights_in_fit_too():
    """The fit's default policy is the plan's: a model built in bfloat16 is gathered in
    bfloat16 from float32 master weights (4 B per sharded element, not 2)."""

    def half(batch: int):
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            return meta_blocks(batch)
        finally:
            torch.set_default_dtype(before)

    found = executor.fit(half, MEMORY, target=TOY, world_size=2, time_limit=30)
    assert found.fsdp.memory.resident_parts["sharded params"] == 4 * (3 * 528 + 66)
    assert sum(found.fsdp.memory.unsharded_grads) == 2 * (3 * (WIDTH * WIDTH + WIDTH) + 132)


def test_a_given_policy_must_agree_with_the_call():
    with torch.device("meta"):
        net = torch.nn.Linear(4, 4)
    for fsdp, world, message in [
        (FsdpPolicy(4), 2, r"world_size=2 and fsdp\.world_size=4 differ"),
        (FsdpPolicy(2), 1, r"fsdp\.rounding=1 is not the target's allocator rounding 512"),
        (FsdpPolicy(2, param_dtype="bfloat16", rounding=512), 1, r"gathers parameters in bf"),
    ]:
        with pytest.raises(PlanError, match=message):
            resolve_policy(net, world, fsdp, _h100())
    with pytest.raises(PlanError, match=r"fsdp\.optimizer 'adamw' is not the fit's 'sgd_mom"):
        resolve_policy(net, 2, FsdpPolicy(2), None, optimizer="sgd_momentum")


def _h100() -> Device:
    from solver.target import builtin_device

    return builtin_device("h100")


class Tied(torch.nn.Module):
    """Two blocks sharing one Linear (the second block's `shared` is the first's)."""

    def __init__(self) -> None:
        super().__init__()
        shared = torch.nn.Linear(8, 8)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"shared": shared, "own": torch.nn.Linear(8, 8)}) for _ in (0, 1)
        )
        self.head = torch.nn.Linear(8, 2)


def test_a_parameter_several_blocks_hold_is_counted_once():
    """FSDP2 manages a parameter in one group: the first block (in forward order) that holds
    it; the root holds those no block does."""
    model = Tied()
    policy = FsdpPolicy(2)
    memory = model_memory(model, list(model.blocks), policy)
    # float32 shards of 2 ranks: a (8, 8) weight 4 x 8 x 4 B, an (8,) bias 4 x 4 B
    linear = 4 * 8 * 4 + 4 * 4
    head = 1 * 8 * 4 + 1 * 4
    assert memory.resident_parts["sharded params"] == 3 * linear + head
    assert memory.unsharded_grads == (2 * 72 * 4, 72 * 4, 18 * 4)
