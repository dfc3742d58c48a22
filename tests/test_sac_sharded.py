"""SAC plans under FSDP2 (`checkpoint_plan(..., world_size=N)`): the per-rank peak is
`solver.target.predict_peak`'s composition of the model's FSDP memory and the plan's
single-process windows; a budget the resident bytes fill is refused in one line."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sac_models import sum_loss, transformer
from test_sac_solver import all_plans, problems

import executor
from cli.main import main
from executor.errors import PlanError
from solver.sac.memory import SacPlan
from solver.sac.problem import Segment
from solver.sac.sharded import plan_windows, rank_peak, shifted
from solver.sac.union import SacUnion, UnionPlan, union_peak
from solver.target import Device, FsdpPolicy, StepWindows, fsdp_memory, predict_peak
from solver.target.devices import NCCL_COMMUNICATOR_BYTES

pytestmark = pytest.mark.usefixtures("one_thread")


def _meta_net():
    with torch.device("meta"):
        return transformer(layers=3, d=32), torch.empty(2, 8, 32)


def _resident_by_hand(net, world: int) -> int:
    """float32 shards (dim 0 padded to a multiple of the ranks) and AdamW's two moments of
    rank 0's rows, each rounded to 512 B."""

    def r(n: int) -> int:
        return -(-n // 512) * 512

    total = 0
    for p in net.parameters():
        rows, rest = -(-p.shape[0] // world), math.prod(p.shape[1:])
        total += r(rows * rest * 4) + 2 * r(min(rows, p.shape[0]) * rest * 4)
    return total


def test_per_rank_peak_is_predict_peaks_composition():
    net, x = _meta_net()
    kw = {"loss_fn": sum_loss, "target": "h100", "world_size": 2, "regions": "blocks"}
    plain = executor.checkpoint_plan(net, (x,), "100%", **kw)
    union = plain.problem
    policy = FsdpPolicy(2, "float32", "float32", rounding=512)
    blocks = [list(b.parameters()) for b in net.blocks]
    inside = {id(p) for ps in blocks for p in ps}
    memory = fsdp_memory(
        [[tuple(p.shape) for p in ps] for ps in blocks],
        [tuple(p.shape) for p in net.parameters() if id(p) not in inside],
        policy,
    )
    assert memory.resident == _resident_by_hand(net, 2)
    p = union.blocks
    raw = StepWindows.from_segments(
        [b.f_start for b in p.blocks],
        [b.f_peak for b in p.blocks],
        [b.b_start for b in p.blocks],
        [b.b_peak for b in p.blocks],
        p.segments,
    )
    expected = predict_peak(memory, raw).peak
    assert not any(plain.checkpointed) and plain.peak == plain.plain_peak == expected
    assert "per rank of 2" in repr(plain)

    least = executor.checkpoint_plan(net, (x,), "min", **kw)
    assert any(least.checkpointed) and least.peak < plain.peak
    n = len(p.blocks)
    chosen = UnionPlan(SacPlan(least.checkpointed, least.saved), (None,) * n)
    windows = plan_windows(union, chosen)
    assert least.peak == predict_peak(memory, windows).peak <= least.budget
    # the checkpointed blocks' forward savings lower every later block's forward start
    d = [b.f_start - w for b, w in zip(p.blocks, windows.f_start, strict=True)]
    assert d[0] == 0 and d == sorted(d) and d[-1] > 0


def test_budget_below_the_resident_bytes_is_refused_in_one_line(capsys):
    net, x = _meta_net()
    resident = _resident_by_hand(net, 2)
    with pytest.raises(PlanError, match=r"at most the resident bytes") as e:
        executor.checkpoint_plan(net, (x,), resident, loss_fn=sum_loss, target="h100", world_size=2)
    assert "\n" not in str(e.value) and f"{resident:,} B" in str(e.value)
    with pytest.raises(PlanError, match=r"world_size=2 and fsdp\.world_size=4 differ"):
        executor.checkpoint_plan(
            net, (x,), "min", loss_fn=sum_loss, world_size=2, fsdp=FsdpPolicy(4)
        )
    args = ["sac", "--model", "sac_models:small", "--target", "h100", "--world-size", "2"]
    assert main([*args, "--budget", "min", "--time-limit", "30"]) == 0
    assert "per rank of 2 (FSDP2)" in capsys.readouterr().out


def test_no_budget_is_what_the_target_lets_pytorch_allocate():
    """budget None: the device's capacity less the process's memory outside PyTorch and one
    NCCL communicator (FSDP2 over NCCL on a GPU target), not nvidia-smi's memory."""
    net, x = _meta_net()
    gpu = Device("gpu", {"float32": 1e12}, 1e11, memory=1 << 40, capacity=1 << 32, outside=1 << 20)
    plan = executor.checkpoint_plan(net, (x,), None, loss_fn=sum_loss, target=gpu, world_size=2)
    assert plan.budget == (1 << 32) - (1 << 20) - NCCL_COMMUNICATOR_BYTES == gpu.usable(1)
    small = Device("small", gpu.flops, 1e11, 1 << 40, capacity=NCCL_COMMUNICATOR_BYTES + 4096)
    with pytest.raises(PlanError, match=r"per rank \(small's 0\.00 GiB usable \(capacity"):
        executor.checkpoint_plan(net, (x,), None, loss_fn=sum_loss, target=small, world_size=2)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem=problems(), data=st.data())
def test_the_shifted_problem_bounds_every_plans_per_rank_peak(problem, data):
    """Against every plan of drawn problems whose root's backward is measured apart (a stretch
    before, between and after the blocks, as the recording cuts them; the levels inside a
    window at most its peak, each backward window's peak at least the next one's start),
    under a drawn FSDP2 model: the shifted problem's peak plus the resident bytes is at least
    the per-rank peak (`rank_peak`), the bound the sharded solve promises."""
    n = len(problem.blocks)
    segments = tuple(Segment(data.draw(st.integers(0, 300)), h) for h in range(n + 1))
    root_peak = data.draw(st.integers(0, 600))
    # a block's backward window ends where the next one starts: its peak is at least that
    ends = [root_start := data.draw(st.integers(0, root_peak))]
    ends += [b.b_start for b in problem.blocks[:-1]]
    blocks = tuple(
        dataclasses.replace(b, b_peak=max(b.b_peak, end))
        for b, end in zip(problem.blocks, ends, strict=True)
    )
    problem = dataclasses.replace(
        problem,
        blocks=blocks,
        segments=segments,
        backward_start=data.draw(st.integers(0, segments[-1].peak)),
        root_b_start=root_start,
        root_b_peak=root_peak,
        end=data.draw(st.integers(0, root_peak)),
    )
    union = SacUnion.whole(problem)
    shape = st.tuples(st.integers(1, 6), st.integers(1, 6))
    memory = fsdp_memory(
        [data.draw(st.lists(shape, min_size=1, max_size=2)) for _ in range(n)],
        data.draw(st.lists(shape, min_size=1, max_size=2)),
        FsdpPolicy(data.draw(st.integers(2, 4)), "float32", "float32", rounding=8),
    )
    bound = shifted(union, memory)
    for plan in all_plans(problem):
        chosen = UnionPlan(plan, (None,) * n)
        assert union_peak(bound, chosen) + memory.resident >= rank_peak(union, chosen, memory).peak
