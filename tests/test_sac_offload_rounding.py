"""SAC's host bytes under the host allocator's rounding (`solver.Link.host_rounding`; docs/sac.md
"Offload"): each host buffer the runtime allocates (one per output tensor of an offloaded op,
one per saved storage of a parked region) counts as the link rounds it, in the reference
(`plan_host`), in CP-SAT's `host_memory` bound and in `SacSolution.host_peak`; the recording records
those buffers' sizes; `checkpoint_plan` gives the link the rounding of the device its copies
run on (exact on the CPU, where the measured host bytes equal the prediction; the next power of
two on CUDA, where a test reads the pinned allocator's own peak)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from sac_models import MLP, Net, every_saveable, replanned, sum_loss, transformer
from test_sac_offload import every_offloadable, every_plain, measured, sum_step

import executor
from solver.core.link import Link
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError
from solver.sac import SacBlock, SacOp, SacPlan, SacProblem, Segment
from solver.sac.memory import offload_host, park_host, plan_host
from solver.sac.solve import solve_sac
from solver.sac.union import union_host

pytestmark = pytest.mark.usefixtures("one_thread")

MIB = 2**20
EXACT = Link(1e9, 1e9)
POW2 = Link(1e9, 1e9, host_rounding="power-of-two")
LAYER_NORM = (3 * MIB, 1536, 1536)  # native_layer_norm's output, mean and rstd, in bytes


def one_region(sizes: tuple[int, ...] | None = None) -> SacProblem:
    """One region (the shape of test_sac_offload_solver's `test_only_offload_fits_...`, in
    units u of a quarter of op 0's bytes): op 0 creates 4u bytes that autograd saves, its
    kernel holding 20u of scratch, read by op 1 (the output, u). At a budget of 25u only
    offloading op 0 or parking the region fits: both put op 0's bytes on the host. `sizes`:
    op 0's host buffers (its output tensors, and its saved storages), None: one of 4u."""
    new = 4 * MIB * 3 // 4 if sizes is None else sum(sizes)
    u = new // 4
    ops = (
        SacOp("aten.op", new, 4e-6, 1, new, True, 20 * u, host_sizes=sizes, saved_sizes=sizes),
        SacOp("aten.relu", u, 1e-6, 1, 0, False, output_bytes=u),
    )
    block = SacBlock("b", ops, 0, 0, 0, f_start=0, f_peak=24 * u, b_start=10 * u, b_peak=10 * u)
    return SacProblem((block,), (Segment(28 * u, 1),), plain_peak=30 * u)


def budget(problem: SacProblem) -> int:
    return problem.blocks[0].ops[1].new_bytes * 25


def test_an_offloaded_3_mib_output_holds_4_mib_of_pinned_host():
    problem = one_region()
    offloading = SacPlan((True,), (frozenset({0}),), (frozenset({0}),))
    parking = SacPlan((False,), (frozenset(),), None, (True,))
    for plan in (offloading, parking):
        assert plan_host(problem, plan) == plan_host(problem, plan, EXACT) == 3 * MIB
        assert plan_host(problem, plan, POW2) == 4 * MIB
    solution = solve_sac(problem, budget(problem), Deadline.after(20), link=POW2)
    assert solution.host_peak == 4 * MIB
    assert solve_sac(problem, budget(problem), Deadline.after(20), link=EXACT).host_peak == 3 * MIB


def test_each_output_of_a_multi_output_op_is_its_own_rounded_buffer():
    """native_layer_norm's three outputs: 3 MiB + 2 x 1536 B requested, 4 MiB + 2 x 2048 B
    held (not the 4 MiB of one buffer of their sum); a parked region's two saved storages
    likewise."""
    problem = one_region(LAYER_NORM)
    op = problem.blocks[0].ops[0]
    assert offload_host(op, EXACT) == offload_host(op, None) == 3 * MIB + 3072
    assert offload_host(op, POW2) == 4 * MIB + 4096
    assert park_host(problem.blocks[0], POW2) == 4 * MIB + 4096
    parked = dataclasses.replace(op, saved_sizes=(3 * MIB, 3072))
    assert park_host(dataclasses.replace(problem.blocks[0], ops=(parked,)), POW2) == 4 * MIB + 4096
    solution = solve_sac(problem, budget(problem), Deadline.after(20), link=POW2)
    assert solution.host_peak == 4 * MIB + 4096


@pytest.mark.parametrize("sizes", [None, LAYER_NORM])
def test_host_memory_refuses_a_plan_that_fits_only_unrounded(sizes):
    """The host limit at the rounded bytes less one: the exact link fits the plan, the
    power-of-two link refuses it (no plan keeps op 0's bytes off the host within 25u)."""
    problem = one_region(sizes)
    rounded = 4 * MIB if sizes is None else 4 * MIB + 4096
    tight = dataclasses.replace(POW2, host_memory=rounded - 1)
    exact = dataclasses.replace(EXACT, host_memory=rounded - 1)
    assert solve_sac(problem, budget(problem), Deadline.after(20), link=exact).host_peak < rounded
    with pytest.raises(InfeasibleBudgetError):
        solve_sac(problem, budget(problem), Deadline.after(20), link=tight)
    fits = dataclasses.replace(POW2, host_memory=rounded)
    assert solve_sac(problem, budget(problem), Deadline.after(20), link=fits).host_peak == rounded


def test_sizes_survive_json_and_ops_without_them_hold_one_buffer_of_their_bytes():
    block = one_region(LAYER_NORM).blocks[0]
    assert SacBlock.from_json(block.to_json()) == block
    old = block.to_json()
    for op in old["ops"]:  # a format 6 plan file's ops
        del op["host_sizes"], op["saved_sizes"]
    loaded = SacBlock.from_json(old).ops[0]
    assert (loaded.host_sizes, loaded.saved_sizes) == (None, None)
    assert offload_host(loaded, POW2) == park_host(SacBlock.from_json(old), POW2) == 4 * MIB


def test_the_recording_records_each_output_tensor_and_saved_storage_and_cpu_plans_stay_exact():
    """A transformer planned on the CPU with a power-of-two link: the plan's link is exact (the
    CPU's clones), every op's host sizes are its output tensors' bytes (native_layer_norm's
    three: output, mean, rstd), its saved sizes sum to its saved bytes; every offloadable op
    offloaded and every region that may park parked, the measured host bytes equal the
    prediction."""
    net, x = transformer(), torch.randn(4, 32, 32)
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss, offload=POW2)
    assert plan.link == EXACT
    norms = [op for r in plan.problem.regions() for op in r.ops if "native_layer_norm" in op.name]
    assert norms
    for op in norms:  # (4, 32, 32) float32 normalized over 32: mean and rstd (4, 32, 1)
        assert op.host_sizes == (4 * 32 * 32 * 4, 4 * 32 * 4, 4 * 32 * 4)
    for op in (op for r in plan.problem.regions() for op in r.ops):
        assert sum(op.saved_sizes) == op.saved_bytes
    saved = every_saveable(plan)
    every, _ = replanned(plan, saved, every_offloadable(plan, saved), every_plain(plan))
    host = union_host(plan.problem, every.union_plan(), plan.link)
    model = every.apply(copy.deepcopy(net))
    assert measured(model, sum_step(x))[1] == host > 0


def test_an_estimate_for_a_gpu_rounds_as_pinned_memory():
    """Estimate mode for an H100 (the plan's copies run on CUDA): the link rounds to powers of
    two and the plan's host bytes are the rounded buffers'."""
    with torch.device("meta"):
        net = Net([MLP(48, 96, 0.0) for _ in range(3)], 48)
    x = torch.empty(3, 40, 48, device="meta")
    plan = executor.checkpoint_plan(
        net, (x,), "min", time_limit=60, loss_fn=sum_loss, target="h100", offload="h100"
    )
    assert plan.link.host_rounding == "power-of-two"
    assert plan.host_peak == union_host(plan.problem, plan.union_plan(), plan.link)
    saved = every_saveable(plan)
    every, _ = replanned(plan, saved, every_offloadable(plan, saved), every_plain(plan))
    union_plan = every.union_plan()
    # 3 x 40 x 48 float32 outputs: 23,040 B each, 32 KiB pinned
    assert union_host(plan.problem, union_plan, plan.link) > union_host(plan.problem, union_plan)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_pinned_allocators_peak_is_the_plans_host_bytes():
    """An MLP net planned on CUDA (its link rounds to powers of two), every offloadable op
    offloaded and every region that may park parked: one step's peak of active pinned bytes
    (`torch.cuda.host_memory_stats`, the CachingHostAllocator's rounded blocks) is the plan's
    predicted host bytes, and more than the requested bytes (3 x 40 x 48 float32 tensors)."""
    torch.manual_seed(0)
    device = torch.device("cuda", torch.cuda.current_device())
    net = Net([MLP(48, 96, 0.0) for _ in range(3)], 48).to(device).train()
    x = torch.randn(3, 40, 48, device=device)
    plan = executor.checkpoint_plan(
        net, (x,), "min", time_limit=60, loss_fn=sum_loss, offload="h100"
    )
    assert plan.link.host_rounding == "power-of-two"
    saved = every_saveable(plan)
    every, _ = replanned(plan, saved, every_offloadable(plan, saved), every_plain(plan))
    union_plan = every.union_plan()
    predicted = union_host(plan.problem, union_plan, plan.link)
    model = every.apply(copy.deepcopy(net))
    model(x).sum().backward()  # warm-up
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    # an allocation processes the ended copies' events: the warm-up's blocks stop being active
    torch.empty(1, pin_memory=True)  # freed at once: no copy used it
    torch.cuda.reset_peak_host_memory_stats()
    start = torch.cuda.host_memory_stats()["active_bytes.current"]
    model(x).sum().backward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.host_memory_stats()["active_bytes.peak"] - start
    print(f"pinned peak {peak} B, predicted {predicted} B")
    assert peak == predicted > union_host(plan.problem, union_plan)
