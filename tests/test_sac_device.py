"""The device a measured SAC recording runs on (`executor.sac.recording.measurer.DeviceMeter`): the
CPU or the one CUDA device the model and its inputs are on. On the CPU, with a recording fake of
the `torch.cuda` calls the meter makes: on CUDA it synchronizes the device before every read
of the clock (an op's seconds, a region's prices, the offload overhead), reads the profiler's
allocation events of its own device only, counts the CUDA allocator's 512-byte blocks, and
reads the device's generator (whose state, like the CPU's, is a host tensor: no device
bytes); `checkpoint_plan` records through the meter of the model's device and refuses
tensors on two devices in one line. Marked `cuda`: an HF GPT-2 (SDPA attention, dropout on)
planned on the GPU, trained bit for bit against eager, within its predicted peak."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from sac_models import assert_same_adamw_steps, mlp_net, sum_loss
from torch._C._profiler import _EventType

import executor
from executor import PlanError
from executor.sac import recorded_step
from executor.sac.recording.measurer import DeviceMeter, Measurer
from executor.sac.recording.op_streams import record_ops
from executor.sac.recording.overhead import Stream, measure_offload_seconds, measure_overhead

pytestmark = pytest.mark.usefixtures("one_thread")

CUDA0 = torch.device("cuda", 0)


class RecordingCuda:
    """The `torch.cuda` calls `DeviceMeter` makes, logged in order."""

    def __init__(self, log: list) -> None:
        self.log = log

    def synchronize(self, device: torch.device) -> None:
        self.log.append(("synchronize", device))

    def get_rng_state(self, device: torch.device) -> torch.Tensor:
        self.log.append(("get_rng_state", device))
        return torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's state: a host tensor


def recording_meter(device: torch.device, log: list) -> DeviceMeter:
    def clock() -> float:
        log.append(("clock",))
        return float(len(log))

    return DeviceMeter(device, cuda=RecordingCuda(log), clock=clock)


def synchronized_before_each_read(log: list) -> bool:
    reads = [k for k, entry in enumerate(log) if entry == ("clock",)]
    return bool(reads) and all(k > 0 and log[k - 1] == ("synchronize", CUDA0) for k in reads)


def test_on_cuda_an_op_is_timed_between_two_synchronized_clock_reads():
    log: list = []
    measured = Measurer(recording_meter(CUDA0, log))
    out, seconds = measured.call(lambda x: log.append(("op",)) or x + 1, (1,), {})
    assert out == 2 and seconds == 3.0
    sync, clock = ("synchronize", CUDA0), ("clock",)
    assert log == [sync, clock, ("op",), sync, clock]


def test_on_cuda_region_prices_read_the_clock_after_synchronizing():
    """The region timed alone three ways (`measure_overhead`): every clock read of every run
    follows a synchronize of the plan's device."""
    net, x = mlp_net(layers=1), torch.randn(4, 32)
    block = net.blocks[0]

    def step() -> torch.Tensor:
        return sum_loss(net(x))

    (facts,) = record_ops(net, [block], step, range(1))
    stream = Stream(tuple(o.name for o in facts.ops), (0.0,) * len(facts.ops), facts.stop)
    log: list = []
    measure_overhead(
        net, [block], [stream], step, repeats=2, measurer=Measurer(recording_meter(CUDA0, log))
    )
    assert synchronized_before_each_read(log)
    assert sum(entry == ("clock",) for entry in log) == 2 * 3 * (1 + 2)  # warm-up, 2 rounds


def test_the_offload_overhead_is_timed_by_the_plans_meter():
    """`measure_offload_seconds` reads the meter it is given (the plan's device), the CPU's
    without a synchronize."""
    log: list = []
    seconds = measure_offload_seconds(rounds=2, meter=recording_meter(torch.device("cpu"), log))
    assert seconds >= 0 and log == [("clock",)] * (2 * 2 * 2)


def allocation(device: torch.device, time: int, size: int, children=()) -> SimpleNamespace:
    fields = SimpleNamespace(device=device, alloc_size=size)
    return SimpleNamespace(
        tag=_EventType.Allocation, extra_fields=fields, start_time_ns=time, children=children
    )


def test_the_meter_reads_the_allocation_events_of_its_own_device():
    op = SimpleNamespace(tag=_EventType.TorchOp, start_time_ns=0, children=[])
    op.children = [
        allocation(torch.device("cpu"), 3, 100),
        allocation(torch.device("cuda", 0), 4, 512),
        allocation(torch.device("cuda", 1), 5, 1024),
        allocation(torch.device("cuda", 0), 6, -512),
    ]
    tree = [op, allocation(torch.device("cuda", 0), 1, 2048)]
    prof = SimpleNamespace(
        profiler=SimpleNamespace(
            kineto_results=SimpleNamespace(experimental_event_tree=lambda: tree)
        )
    )
    assert DeviceMeter(CUDA0).events(prof) == [(1, 2048), (4, 512), (6, -512)]
    assert DeviceMeter().events(prof) == [(3, 100)]


def test_storage_bytes_are_the_allocators():
    cuda, cpu = DeviceMeter(CUDA0), DeviceMeter()
    assert [cuda.nbytes(n) for n in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]
    assert [cpu.nbytes(n) for n in (0, 1, 513)] == [0, 1, 513]


def test_rng_states_are_the_cpus_and_the_devices_and_only_device_bytes_count():
    """A checkpoint keeps the CPU generator's state and, on CUDA, the device's: both host
    tensors, so a CUDA plan counts none of them on the device; a CPU plan the CPU's."""
    log: list = []
    measured = Measurer(recording_meter(CUDA0, log))
    assert measured.rng_state_bytes() == 0 and ("get_rng_state", CUDA0) in log
    assert len(measured.meter.rng_states()) == 2
    cpu = Measurer()
    assert cpu.rng_state_bytes() == torch.get_rng_state().untyped_storage().nbytes() == 5056


def test_tensors_on_two_devices_are_refused_in_one_line():
    net = mlp_net(layers=2)
    with pytest.raises(PlanError, match=r"one device.*on cpu, meta") as error:
        executor.checkpoint_plan(net, (torch.randn(4, 32, device="meta"),), "50%")
    assert "\n" not in str(error.value)


def test_the_recording_reads_the_meter_of_the_models_device(monkeypatch):
    """`checkpoint_plan` records through a `DeviceMeter` of the model's device: its windows'
    bytes from the meter's allocation events, every op, region and offload probe timed by its
    clock."""
    made: list[DeviceMeter] = []
    calls = {"events": 0, "now": 0}

    class Counting(DeviceMeter):
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            made.append(self)

        def events(self, prof):
            calls["events"] += 1
            return super().events(prof)

        def now(self) -> float:
            calls["now"] += 1
            return super().now()

    monkeypatch.setattr(recorded_step, "DeviceMeter", Counting)
    net, x = mlp_net(layers=2), torch.randn(4, 8, 32)
    executor.checkpoint_plan(net, (x,), "min", loss_fn=sum_loss, regions="blocks", offload="h100")
    assert [m.device for m in made] == [torch.device("cpu")]
    assert calls["events"] == 1  # the windows' step
    assert calls["now"] > 2 * 60 * 2  # the ops, the regions, and the offload probe's 60 rounds


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_hf_gpt2_planned_on_cuda_is_exact_and_within_its_predicted_peak():
    """HF GPT-2 (SDPA attention, dropout 0.1: CUDA's op stream, not the CPU's) planned on the
    GPU at 50%, applied to a copy: losses, gradients and buffers `torch.equal` to eager's over
    2 AdamW steps with deterministic kernels, one step's measured peak
    (`max_memory_allocated` above its start) within the plan's predicted one."""
    from graph_capture.models.hf_models import gpt2_lm

    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, (ids,), kwargs = gpt2_lm(batch=2, seq=16, layers=3, width=32)
    assert model.config._attn_implementation == "sdpa" and model.config.attn_pdrop > 0
    device = torch.device("cuda", torch.cuda.current_device())
    model, ids = model.to(device), ids.to(device)
    kwargs = {"labels": ids, "use_cache": False}
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        plan = executor.checkpoint_plan(model, (ids,), "50%", example_kwargs=kwargs)
        assert plan.checkpointed_regions()
        runs = [copy.deepcopy(model), plan.apply(copy.deepcopy(model))]

        def step(m: torch.nn.Module) -> None:
            m(ids, **kwargs).loss.backward()

        step(runs[1])
        runs[1].zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        measured = executor.measure_peak(lambda: step(runs[1]), device).peak_bytes
        print(f"measured {measured} B, predicted {plan.peak} B, budget {plan.budget} B")
        assert measured <= plan.peak <= plan.budget
        runs[1].zero_grad(set_to_none=True)
        assert_same_adamw_steps(runs, lambda m, _: m(ids, **kwargs).loss, steps=2)
    finally:
        torch.use_deterministic_algorithms(deterministic)
