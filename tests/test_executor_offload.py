"""The own executor runs offload and reload ops (docs/offload.md, "Running offload"): gradients
bit for bit against eager, the host pool's bytes equal to the simulator's host peak, and the
measured device peak within the schedule's peak and its budget.

Schedules come from the exact solver with a link (where it offloads: a budget below the least
that keep/recompute reaches) and from `with_offloads`: a keep/recompute schedule whose
recomputes of chosen values become reloads of a copy offloaded after the first compute (valid
by construction, checked by the simulator), so any model and keep-set can be drawn.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_executor_exactness import CONV_BLOCKS, SEQ_BLOCKS, assert_same_training, build
from torch import nn

import solver
from benchmarks.running.offload import Reduction, measure, solved
from executor.errors import ExecutorError, RematerializeError, UnsupportedScheduleError
from executor.memory import measure_peak
from executor.traced.interpreter import ScheduleInterpreter
from executor.traced.module import Rematerialized
from executor.traced.offload import HostPool, StepCopies, Transfers
from executor.traced.rematerialize import rematerialize
from graph_capture import capture
from graph_capture.measurement.device import fork_rng
from graph_capture.models.demo_models import TinyGPT
from solver import Link, prepare
from solver.core.schedule import Schedule, make_schedule
from solver.core.stages import plan_from_keep, plan_to_ops
from solver.errors import InvalidScheduleError
from solver.target.devices import UnknownTargetError

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = Link(1e9, 1e9)  # bytes per second: a few KiB take microseconds, as the nodes do


def with_offloads(captured, keep_mask: list[bool], offload_mask: list[bool], link: Link):
    """The keep/recompute schedule keeping the nodes `keep_mask` marks (cycled over the solver
    order), where each value `offload_mask` marks among those it recomputes is offloaded after
    its first compute and reloaded instead of recomputed."""
    problem = prepare(captured.dag)
    keep = [i for i in range(problem.n) if keep_mask[i % len(keep_mask)]]
    ops = plan_to_ops(problem, plan_from_keep(problem, keep)).ops
    computes = Counter(v for kind, v in ops if kind == "compute")
    chosen = {v for v, n in computes.items() if n > 1 and offload_mask[v % len(offload_mask)]}
    out: list[tuple[str, int]] = []
    computed: set[int] = set()
    for kind, v in ops:
        if kind != "compute" or v not in chosen:
            out.append((kind, v))
        elif v in computed:
            out.append(("reload", v))
        else:
            out += [("compute", v), ("offload", v)]
        computed.add(v)
    return make_schedule(captured.dag, problem, out, method="test-offload", link=link)


def copies_of(schedule: Schedule) -> tuple[int, int]:
    kinds = [kind for kind, _ in schedule.ops]
    return kinds.count("offload"), kinds.count("reload")


def measured_step(rm: Rematerialized, inputs, backward) -> tuple[int, int]:
    """(measured device peak, host pool peak) of one step after a warm-up step, `.grad`
    allocated before it, the RNG state left as it was."""
    for p in rm.parameters():
        p.grad = torch.zeros_like(p)
    with fork_rng(torch.device("cpu")):
        backward(rm(*inputs))
        rm.host_pool.reset_peak()
        device = measure_peak(lambda: backward(rm(*inputs))).peak_bytes
    return device, rm.host_pool.host_peak


def ones_backward(out: torch.Tensor) -> None:
    out.backward(torch.ones_like(out))


@pytest.fixture(scope="module")
def below_least():
    """`Reduction` and its schedules (`benchmarks.running.offload.solved`): the keep/recompute
    least and the offload optimum 8 bytes below it (two CP-SAT workers prove it in about 8 s
    on two busy cores, where eight take longer)."""
    torch.manual_seed(0)
    model, x = Reduction().train(), torch.randn(32, 16)
    captured, schedules = solved(model, x, time_limit=30, below=(8,))
    return model, x, captured, schedules


def test_offload_trains_bit_for_bit_below_the_keep_recompute_least(below_least):
    model, x, captured, schedules = below_least
    least, schedule = schedules["keep/recompute at its least"], schedules["offload 8 B below it"]
    with pytest.raises(solver.InfeasibleBudgetError):
        solver.solve(captured.dag, schedule.budget, time_limit=10)
    assert copies_of(schedule)[0] > 0 and schedule.peak < least.peak
    for compiled in (True, False):
        assert_same_training(
            copy.deepcopy(model), x, lambda c: schedule, steps=2, compiled=compiled
        )
    rm = Rematerialized(copy.deepcopy(model), captured, schedule)
    device, host = measured_step(rm, [x], ones_backward)
    assert device <= schedule.peak <= schedule.budget
    assert host == schedule.extra["host_peak"] > 0
    assert rm.host_pool.host_held == 0  # every copy released by the step's end


def test_the_offload_benchmark_measures_what_the_schedules_predict(below_least):
    model, x, captured, schedules = below_least
    rows = measure(model, x, captured, schedules, reps=2)
    assert [row["schedule"] for row in rows] == list(schedules)
    for row in rows:
        assert row["measured_device_peak"] <= row["predicted_peak"] <= row["budget_bytes"]
        assert row["measured_host_peak"] == row["predicted_host_peak"]
        assert row["step_vs_eager_measured"] > 0
    assert rows[-1]["offloads"] > 0


def test_a_saved_offload_schedule_loads_and_runs(below_least, tmp_path):
    model, x, _, schedules = below_least
    schedule = schedules["offload 8 B below it"]
    path = tmp_path / "offload.json"
    Rematerialized(copy.deepcopy(model), capture(model, [x]), schedule).save(path)
    loaded = Rematerialized.load(path, copy.deepcopy(model), x)
    assert loaded.schedule.link == FAST and loaded.schedule.ops == schedule.ops
    assert_same_training(copy.deepcopy(model), x, lambda c: loaded.schedule, steps=1)


def test_rematerialize_solves_with_a_link_and_refuses_what_names_none():
    torch.manual_seed(0)
    model, x = Reduction(factor=2).train(), torch.randn(8, 16)
    rm = rematerialize(copy.deepcopy(model), x, "100%", offload="pcie5", time_limit=20)
    pcie5 = solver.target.devices.HOST_LINKS["pcie5"]
    # the link's bandwidths, with the host rounding of the CPU pool that runs the copies
    assert rm.schedule.link == dataclasses.replace(pcie5, host_rounding="exact")
    assert rm.host_pool is not None
    eager = copy.deepcopy(model)
    ones_backward(eager(x))
    ones_backward(rm(x))
    for a, b in zip(eager.parameters(), rm.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    with pytest.raises(UnknownTargetError, match="pcie5"):
        rematerialize(model, x, "50%", offload="pcie9")
    with pytest.raises(RematerializeError, match=r"solver\.Link"):
        rematerialize(model, x, "50%", offload=64e9)


def tanh_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 16)
    ).train()


@pytest.mark.parametrize(
    ("make", "keep_mask", "offload_mask"),
    [
        (Reduction, [False], [True, False]),
        (Reduction, [False, False, True], [True]),
        (tanh_mlp, [True, False], [True]),
    ],
)
@pytest.mark.parametrize("compiled", [True, False])
def test_measured_device_peak_is_the_predicted_peak_to_the_byte(
    make, keep_mask, offload_mask, compiled
):
    """Without random nodes nothing is charged that a step does not allocate (docs/executor.md,
    "The byte budget"): a reloaded value freed by the schedule is released there, a reload's
    destination is its storages' bytes, and the host copies are outside the device count."""
    torch.manual_seed(0)
    model, x = make(), torch.randn(32, 16)
    captured = capture(copy.deepcopy(model), [x])
    schedule = with_offloads(captured, keep_mask, offload_mask, FAST)
    assert copies_of(schedule)[0] > 0
    rm = Rematerialized(model, captured, schedule, compiled=compiled)
    assert measured_step(rm, [x], ones_backward) == (schedule.peak, schedule.extra["host_peak"])


def test_steps_in_flight_together_keep_their_own_copies():
    """Two forwards before their backwards (micro-batches): each step's host copies are its
    own, the pool holds both, and the accumulated gradients are eager's."""
    torch.manual_seed(0)
    model = tanh_mlp()
    x1, x2 = torch.randn(32, 16), torch.randn(32, 16)
    captured = capture(copy.deepcopy(model), [x1])
    schedule = with_offloads(captured, [False], [True], FAST)
    eager, remat = copy.deepcopy(model), copy.deepcopy(model)
    (eager(x1).sum() + eager(x2).square().sum()).backward()
    rm = Rematerialized(remat, captured, schedule)
    first = rm(x1)
    one = rm.host_pool.host_held
    second = rm(x2)
    assert rm.host_pool.host_held == 2 * one > 0
    (first.sum() + second.square().sum()).backward()
    assert rm.host_pool.host_held == 0
    for a, b in zip(eager.parameters(), remat.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(
    family=st.sampled_from(["seq", "conv"]),
    data=st.data(),
    keep_mask=st.lists(st.booleans(), min_size=1, max_size=5),
    offload_mask=st.lists(st.booleans(), min_size=1, max_size=4).filter(any),
    seed=st.integers(0, 1000),
    bandwidths=st.tuples(st.sampled_from([1e6, 1e8, 1e10]), st.sampled_from([1e6, 1e8, 1e10])),
    compiled=st.booleans(),
)
def test_drawn_models_and_copies_train_bit_for_bit_within_their_peaks(
    family, data, keep_mask, offload_mask, seed, bandwidths, compiled
):
    names = data.draw(
        st.lists(
            st.sampled_from(sorted(SEQ_BLOCKS if family == "seq" else CONV_BLOCKS)),
            min_size=1,
            max_size=4,
        )
    )
    model, x = build(family, names, seed)
    link = Link(*bandwidths)
    captured = capture(copy.deepcopy(model), [x])
    schedule = with_offloads(captured, [False, *keep_mask], offload_mask, link)
    assert copies_of(schedule)[0] > 0
    assert_same_training(model, x, lambda c: schedule, steps=2, compiled=compiled)
    rm = Rematerialized(copy.deepcopy(model), captured, schedule, compiled=compiled)
    device, host = measured_step(rm, [x], ones_backward)
    assert device <= schedule.peak
    assert host == schedule.extra["host_peak"]


def test_a_gpt_block_with_every_recompute_a_reload_trains_bit_for_bit():
    """Attention's views and transposes, dropout's masks (bool, replayed draws), embeddings
    and the int64 targets: every value the keep-nothing schedule recomputes is reloaded."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=32, seq=8, width=16, heads=2, layers=1).train()
    generator = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randint(0, 32, (2, 8), generator=generator) for _ in range(2))
    captured = capture(model, inputs)
    schedule = with_offloads(captured, [False], [True], FAST)
    offloads, reloads = copies_of(schedule)
    assert offloads > 20 and reloads >= offloads
    for compiled in (True, False):
        eager, remat = copy.deepcopy(model), copy.deepcopy(model)
        rm = Rematerialized(remat, captured, schedule, compiled=compiled)
        for step in range(2):
            torch.manual_seed(step)
            want = eager(*inputs)
            want.backward()
            torch.manual_seed(step)
            got = rm(*inputs)
            got.backward()
            assert torch.equal(got, want)
            for a, b in zip(eager.parameters(), remat.parameters(), strict=True):
                assert torch.equal(a.grad, b.grad)
    device, host = measured_step(rm, inputs, lambda loss: loss.backward())
    assert device <= schedule.peak and host == schedule.extra["host_peak"]


class Mixed(nn.Module):
    """bfloat16 values, the int64 indices of a max and the bool condition of a where."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        top, _ = h.max(-1, keepdim=True)
        gated = torch.where(h > 0, torch.tanh(h), h * 0.5)
        return self.out(self.drop(gated) * top)


def test_bfloat16_int64_and_bool_values_survive_the_round_trip():
    torch.manual_seed(0)
    model, x = Mixed().to(torch.bfloat16).train(), torch.randn(4, 6, 8, dtype=torch.bfloat16)
    captured = capture(copy.deepcopy(model), [x])
    schedule = with_offloads(captured, [False], [True], FAST)
    reloaded = {v for kind, v in schedule.ops if kind == "reload"}
    dtypes = {d for v in reloaded for d in captured.dag.nodes[v]["dtypes"]}
    assert {"bfloat16", "int64", "bool"} <= dtypes
    assert_same_training(model, x, lambda c: schedule, steps=2)


def test_a_copy_keeps_views_aliases_strides_and_dtypes_and_counts_its_storages():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    mask = torch.rand(5, 3, generator=torch.Generator().manual_seed(0)) > 0.5
    static = torch.ones(3, 4)
    values = {
        0: base.t()[1:],  # non-contiguous view with an offset
        1: base[:, :2],  # another view of the same storage
        2: (torch.arange(6), mask.t(), None),  # a tuple: int64, a non-contiguous bool, None
        3: torch.full((2, 2), 1.5, dtype=torch.bfloat16),
        4: static.t(),  # a view of a placeholder's storage: kept, not copied
        5: torch.empty(0, 3),
    }
    transfers = Transfers(torch.device("cpu"), {"v": 2})
    copies = StepCopies()
    transfers.offload(copies, "v", values, {static.untyped_storage().data_ptr()})
    stored = 24 * 4 + 6 * 8 + 15 + 4 * 2  # base once, arange, mask, bf16, the empty nothing
    assert transfers.pool.host_held == transfers.pool.host_peak == stored
    for _ in range(2):
        back = transfers.reload(copies, "v")
        flat_in, flat_back = [], []
        for k in values:
            flat_in += values[k] if isinstance(values[k], tuple) else [values[k]]
            flat_back += back[k] if isinstance(back[k], tuple) else [back[k]]
        for a, b in zip(flat_in, flat_back, strict=True):
            if a is None:
                assert b is None
                continue
            assert torch.equal(a, b) and a.dtype == b.dtype
            assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        assert back[0].untyped_storage().data_ptr() == back[1].untyped_storage().data_ptr()
        assert back[0].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
        assert back[4].untyped_storage().data_ptr() == static.untyped_storage().data_ptr()
    # the last reload holds the copy until the compute stream has waited for it
    assert transfers.pool.host_held == stored
    transfers.ready(copies, "v")
    assert transfers.pool.host_held == 0 and transfers.pool.host_peak == stored


def test_a_reloaded_copy_is_held_until_the_compute_stream_waits_for_it():
    """As `solver.simulate` charges it: an offload issued while a last reload is in flight
    counts both copies; the CPU pool counts the bytes exactly."""
    transfers, copies = Transfers(torch.device("cpu"), {"a": 1}), StepCopies()
    transfers.offload(copies, "a", {0: torch.ones(3, dtype=torch.float64)}, set())
    transfers.reload(copies, "a")
    transfers.offload(copies, "c", {0: torch.ones(5, dtype=torch.uint8)}, set())
    assert transfers.pool.host_peak == 24 + 5 and transfers.pool.host_held == 24
    transfers.ready(copies, "a")  # the first read of the reloaded value
    assert transfers.pool.host_held == 0
    ops = [("compute", "a"), ("offload", "a"), ("free", "a"), ("reload", "a")]
    ops += [("compute", "c"), ("offload", "c"), ("compute", "d")]
    schedule_peak = solver.simulate(_held_graph(), ops, Link(1, 1)).host_peak
    assert schedule_peak == transfers.pool.host_peak


def _held_graph():
    """a (24 B) -> d, c (5 B) -> d: the graph of the copies above."""
    graph = nx.DiGraph()
    for v, mem in [("a", 24), ("c", 5), ("d", 0)]:
        graph.add_node(v, mem=mem, cost=1)
    graph.add_edges_from([("a", "d"), ("c", "d")])
    return graph


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_buffers_count_the_bytes_torch_s_host_allocator_takes():
    stats = torch.cuda.host_memory_stats
    key = next(k for k in ("active_bytes.current", "allocated_bytes.current") if k in stats())
    pool, mib = HostPool(pinned=True), 1 << 20
    # earlier tests' freed blocks stay active until an allocation processes their copies'
    # events: process them before reading the start
    torch.cuda.synchronize()
    torch.empty(1, pin_memory=True)  # freed at once: no copy used it
    before = stats()[key]
    buffer = pool.allocate(3 * mib)
    assert buffer.numel() == 3 * mib and buffer.is_pinned()
    assert pool.host_held == pool.host_peak == stats()[key] - before == 4 * mib
    event = torch.cuda.Event()
    event.record()
    pool.release(buffer, event)
    again = pool.allocate(3 * mib + 1)  # its idle block, once the event has completed
    assert again.data_ptr() == buffer.data_ptr() and event.query()
    assert stats()[key] - before == 4 * mib and pool.host_held == 4 * mib


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_pinned_pool_s_peak_is_the_predicted_host_peak():
    torch.manual_seed(0)
    model, x = Reduction().train(), torch.randn(32, 16)
    captured = capture(copy.deepcopy(model), [x])
    pinned = Link(1e9, 1e9, host_rounding="power-of-two")
    schedule = with_offloads(captured, [False], [True], pinned)
    assert copies_of(schedule)[1] > 0
    rm = Rematerialized(copy.deepcopy(model).cuda(), captured, schedule)
    for _ in range(2):  # the second step reuses the pool's idle blocks
        rm.host_pool.reset_peak()
        rm(x.cuda()).sum().backward()
        torch.cuda.synchronize()
    assert rm.host_pool.host_peak == schedule.extra["host_peak"] > 0
    assert rm.host_pool.host_held == 0


def test_offload_ops_without_a_way_to_run_them_are_refused(below_least):
    model, _, captured, schedules = below_least
    schedule = schedules["offload 8 B below it"]
    with pytest.raises(InvalidScheduleError, match="needs a host link"):
        Rematerialized(model, captured, dataclasses.replace(schedule, link=None))
    with pytest.raises(UnsupportedScheduleError, match="CPU or CUDA"):
        Transfers(torch.device("meta"), {})
    interpreter = ScheduleInterpreter(captured.joint, captured.members, captured.random_nodes)
    step = interpreter.new_step()
    with pytest.raises(ExecutorError, match="no transfers"):
        interpreter.run([("offload", next(iter(captured.members)))], step)
