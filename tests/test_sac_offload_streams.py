"""SAC offload's CUDA path (`executor.sac.runtime.offload.CopyStreams`, docs/sac.md "Offload"): the
calls it issues, recorded on the CPU by a fake of the CUDA calls (`TorchCuda`) through whole
training steps of a plan that offloads ops of checkpointed regions and parks regions' saved
storages; and, where a GPU is, the plan run on it (`-m cuda`)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from sac_models import (
    MLP,
    Net,
    assert_same_adamw_steps,
    every_saveable,
    mlp_net,
    replanned,
    sum_loss,
)
from test_sac_offload import LINK, every_offloadable, every_plain
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import executor
from executor.sac.runtime.offload import CopyStreams

pytestmark = pytest.mark.usefixtures("one_thread")


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class FakeStream:
    def __init__(self, log: list[tuple], name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name, event.name))


class FakeEvent:
    def __init__(self, log: list[tuple], name: str) -> None:
        self.log, self.name = log, name

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record", self.name, stream.name))


class FakeCuda:
    """`TorchCuda`'s calls on the CPU, recorded in `log`: streams and events are names, the
    current stream is tracked through `use`, copies are done at once (so a step is exact)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.current = FakeStream(self.log, "compute")
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def streams(self, device: torch.device) -> bool:
        return True

    def new_stream(self, device: torch.device) -> FakeStream:
        stream = FakeStream(self.log, self._name("stream"))
        self.log.append(("new_stream", stream.name, device))
        return stream

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def use(self, stream: FakeStream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def new_event(self) -> FakeEvent:
        return FakeEvent(self.log, self._name("event"))

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        host = torch.empty_like(tensor)
        host.fake_kind = "pinned"
        return host

    def empty_like(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        target = torch.empty_like(tensor, device=device)
        target.fake_kind = "device"
        self.log.append(("alloc", self.current.name, _ptr(target)))
        return target

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        direction = {"pinned": "d2h", "device": "h2d"}[target.fake_kind]
        self.log.append(("copy", direction, self.current.name, _ptr(source), _ptr(target)))
        target.copy_(source)

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record_stream", _ptr(tensor), stream.name))


class Reads(TorchDispatchMode):
    """Logs each op the step dispatches with the storages it reads: ("read", op, pointer)."""

    def __init__(self, log: list[tuple]) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                self.log.append(("read", str(func), _ptr(t)))
        return func(*args, **(kwargs or {}))


def offloading_plan(net: Net, x: torch.Tensor) -> tuple[executor.CheckpointPlan, int]:
    """`net`'s plan at its least peak, its checkpointed regions saving every op they may and
    offloading every offloadable one, every region that may park parked (checked to do both),
    and its predicted peak (bytes)."""
    plan = executor.checkpoint_plan(net, (x,), "min", time_limit=60, loss_fn=sum_loss, offload=LINK)
    saved = every_saveable(plan)
    every, peak = replanned(plan, saved, every_offloadable(plan, saved), every_plain(plan))
    assert any(every.offloads()) and any(every.plain_offloads())
    return every, peak


def after(log: list[tuple], start: int, entry: tuple) -> int:
    """The index of the first `entry` in `log` after `start`; a failure where there is none."""
    for i in range(start + 1, len(log)):
        if log[i] == entry:
            return i
    raise AssertionError(f"{entry} not issued after log entry {start} ({log[start]})")


def test_copies_run_on_one_stream_per_direction_in_the_order_that_keeps_memory_safe():
    """Three training steps of the MLP net's plan (two checkpointed blocks offloading 4 ops
    each, two regions parked) with the recording fake: gradients `torch.equal` to eager's, and
    over every checkpoint call of every step two side streams in all, every copy out on the
    one, every reload on the other. A copy out is issued after the d2h stream waited for the
    compute stream, its source recorded to the d2h stream (the allocator holds its block until
    the copy ends), its event waited for by the compute stream. A reload's device tensor is
    allocated while the compute stream is current, then the h2d stream waits for the compute
    stream, copies, records the tensor and an event, and the compute stream waits for that
    event before any op reads the tensor."""
    net, x = mlp_net(), torch.randn(4, 32, 32)
    plan, _ = offloading_plan(net, x)
    cuda = FakeCuda()
    log = cuda.log
    model = plan.apply(copy.deepcopy(net), CopyStreams(cuda))
    with Reads(log):
        assert_same_adamw_steps([copy.deepcopy(net), model], lambda m, _: m(x).sum())

    created = [e for e in log if e[0] == "new_stream"]
    assert len(created) == 2, created
    copies = [(i, e) for i, e in enumerate(log) if e[0] == "copy"]
    on = {d: {e[2] for _, e in copies if e[1] == d} for d in ("d2h", "h2d")}
    assert len(on["d2h"]) == len(on["h2d"]) == 1 and on["d2h"] != on["h2d"], on
    (d2h,), (h2d,) = on["d2h"], on["h2d"]
    assert {d2h, h2d} == {e[1] for e in created} and "compute" not in (d2h, h2d)
    assert sum(e[1] == "d2h" for _, e in copies) >= 3 * (8 + 2)  # 8 ops and 2 regions a step

    previous = -1
    for i, (_, direction, _, source, target) in copies:
        stream = d2h if direction == "d2h" else h2d
        waited = [j for j in range(previous + 1, i) if log[j] == ("wait_stream", stream, "compute")]
        assert waited, f"copy {log[i]} issued without its stream waiting for the compute stream"
        recorded = source if direction == "d2h" else target
        assert log[i + 1] == ("record_stream", recorded, stream), log[i : i + 3]
        kind, event, on_stream = log[i + 2]
        assert (kind, on_stream) == ("record", stream), log[i + 2]
        wait = after(log, i, ("wait_event", "compute", event))
        if direction == "h2d":
            allocated = max(j for j in range(i) if log[j][0] == "alloc" and log[j][2] == target)
            assert log[allocated][1] == "compute" and allocated < waited[-1]
            reads = [j for j in range(i + 1, len(log)) if log[j][0] == "read"]
            first = next(j for j in reads if log[j][2] == target)
            assert wait < first, f"{log[first]} read the reload before the compute stream waited"
        previous = i


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_offload_on_cuda_is_exact_within_its_peak_and_allocates_on_the_compute_stream():
    """An MLP net (no dropout: its CPU op stream is CUDA's) planned on the CPU, every
    offloadable op offloaded and every region that may park parked, run on CUDA with
    deterministic kernels: losses, gradients and buffers `torch.equal` to eager's over 3 AdamW
    steps; one step's peak of requested bytes above its start (`max_memory_allocated`'s, less
    the allocator's rounding of each block to 512 B, which the plan does not count) within the
    plan's predicted peak; and every segment the caching allocator holds after the step
    belongs to the compute stream (a reload allocated on a side stream holds its segment back
    from the compute stream's pool)."""
    torch.manual_seed(0)
    d = 128
    net, x = Net([MLP(d, 4 * d, 0.0) for _ in range(3)], d).train(), torch.randn(8, 64, d)
    plan, peak = offloading_plan(net, x)
    device = torch.device("cuda", torch.cuda.current_device())
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        xs = x.to(device)
        model = plan.apply(copy.deepcopy(net).to(device))
        assert_same_adamw_steps([copy.deepcopy(net).to(device), model], lambda m, _: m(xs).sum())
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_stats(device)
        model(xs).sum().backward()
        torch.cuda.synchronize(device)
        stats = torch.cuda.memory_stats(device)
        requested = stats["requested_bytes.all.peak"] - start["requested_bytes.all.current"]
        allocated = stats["allocated_bytes.all.peak"] - start["allocated_bytes.all.current"]
        print(f"requested {requested} B, max_memory_allocated {allocated} B, predicted {peak} B")
        assert requested <= peak
        compute = torch.cuda.current_stream(device).cuda_stream
        segments = [s for s in torch.cuda.memory_snapshot() if s["device"] == device.index]
        assert {s["stream"] for s in segments} == {compute}
    finally:
        torch.use_deterministic_algorithms(deterministic)
