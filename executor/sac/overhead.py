"""Per region, the prices of running it inside checkpoint (`measure_overhead`): seconds a
training step pays for running a region under a SAC policy rather than under plain checkpoint,
and under plain checkpoint rather than without."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import CheckpointError

from executor.errors import PlanError
from executor.sac.measurer import DeviceMeter, Measured
from executor.sac.policy import Policy
from executor.sac.region import run_checkpointed
from executor.sac.step import RecordingTime, Snapshot, Step, hooked, leaf_tensors
from solver.sac import SacBlock

if TYPE_CHECKING:
    from executor.sac.alike import Fingerprints


def copy_tensors(tree: object, copy: Callable[[torch.Tensor], torch.Tensor]) -> object:
    """`tree` with its tensors replaced by `copy` of them as the model sees them: one tensor
    passed twice (``mha(x, x, x)``) stays one tensor, and views of one base stay views of one
    copied base (`copy` is applied to bases only), so that a module that branches on identity
    or aliasing (`nn.MultiheadAttention`'s ``query is key``) takes the path it takes in the
    step."""
    copies: dict[int, torch.Tensor] = {}

    def one(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in copies:
            base = t if t._base is None else t._base
            if id(base) not in copies:
                copies[id(base)] = copy(base)
            if base is not t:
                copied = copies[id(base)]
                copies[id(t)] = (
                    t
                    if copied is base
                    else copied.as_strided(t.size(), t.stride(), t.storage_offset())
                )
        return copies[id(t)]

    return pytree.tree_map_only(torch.Tensor, one, tree)


def region_inputs(
    model: nn.Module, regions: Sequence[nn.Module], step: Step, prints: Fingerprints | None = None
) -> list:
    """Per region, the (args, kwargs) it is called with in one forward of the step: tensors
    detached and cloned, each with its `requires_grad`, identity and aliasing kept
    (`copy_tensors`); with `prints`, each region's fingerprint taken in the same forward
    (executor/sac/alike.py)."""
    calls: list = [None] * len(regions)

    def keep(j: int, args, kwargs) -> None:
        if calls[j] is None:
            with prints.pausing() if prints is not None else contextlib.nullcontext():
                calls[j] = copy_tensors(
                    (args, kwargs), lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                )

    handles = [
        m.register_forward_pre_hook(lambda _m, a, k, j=j: keep(j, a, k), with_kwargs=True)
        for j, m in enumerate(regions)
    ]
    watching = contextlib.ExitStack()
    if prints is not None:
        handles += prints.hooks(regions)
        watching.enter_context(prints)
        watching.enter_context(torch.autograd.graph.saved_tensors_hooks(prints.pack, lambda t: t))
    snapshot = Snapshot(model)
    try:
        with hooked(handles), watching:
            loss = step()
        del loss
    finally:
        snapshot.restore()
    return calls


def _region_step(
    module: nn.Module,
    call,
    policy: Policy | None,
    checkpointed: bool = True,
    now: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds of one forward and backward of the region alone inside `checkpoint(
    use_reentrant=False)`, under `policy` (None: plain checkpoint), the backward rerunning it;
    `checkpointed=False`: without checkpoint. `now`: the clock (`DeviceMeter.now`: on CUDA,
    the device synchronized before each read)."""
    # a non-leaf copy: the region may write its inputs in place
    args, kwargs = copy_tensors(call, lambda t: t.clone() if t.requires_grad else t)
    for p in module.parameters():
        p.grad = None
    start = now()
    if checkpointed:
        out = run_checkpointed(module, args, kwargs, policy)
    else:
        out = type(module).forward(module, *args, **kwargs)
    outs = [t for t in leaf_tensors(out) if t.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return now() - start


def _refused_by_checkpoint(error: RuntimeError) -> bool:
    """Whether `error` is autograd's or checkpoint's refusal of the region (an input or saved
    tensor modified in place, a recompute saving other tensors), not out of memory or a bug."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    return isinstance(error, CheckpointError) or "modified by an inplace operation" in str(error)


class RegionTimes(NamedTuple):
    """A region's measured prices, seconds: `overhead`, its step under its all-recompute SAC
    policy minus under plain checkpoint (at least 0); `checkpoint`, its step under plain
    checkpoint minus without checkpoint (full recompute and checkpoint's own machinery; may be
    negative within the timing's noise)."""

    overhead: float
    checkpoint: float


def _region_times(
    module: nn.Module,
    call,
    name: str,
    ops: Sequence[str],
    rounds: Iterable[int],
    now: Callable[[], float] = time.perf_counter,
) -> RegionTimes:
    """The region's step without checkpoint, under plain checkpoint and under its all-recompute
    policy, one warm-up of each, then the `rounds` (0, 1, ...) of the three side by side, the
    order rotated each round; the medians of the rounds' differences, timed by `now`."""
    runs = (
        lambda: _region_step(module, call, None, checkpointed=False, now=now),
        lambda: _region_step(module, call, None, now=now),
        lambda: _region_step(module, call, Policy(name, ops, frozenset()), now=now),
    )
    for run in runs:
        run()
    overheads, checkpoints = [], []
    for r in rounds:
        seconds = [0.0] * 3
        for k in range(3):
            which = (k + r) % 3
            seconds[which] = runs[which]()
        bare, plain, sac = seconds
        overheads.append(sac - plain)
        checkpoints.append(plain - bare)
    return RegionTimes(max(0.0, statistics.median(overheads)), statistics.median(checkpoints))


class Stream(NamedTuple):
    """A region's recorded forward op stream: op names, each op's seconds, and `stop` (the op
    after which a recompute ends)."""

    ops: tuple[str, ...]
    seconds: tuple[float, ...]
    stop: int


def measure_overhead(
    model: nn.Module,
    regions: Sequence[nn.Module],
    streams: Sequence[Stream],
    step: Step,
    repeats: int = 5,
    clock: RecordingTime | None = None,
    measurer: Measured | None = None,
    calls: list | None = None,
) -> list[RegionTimes | RuntimeError]:
    """Per region, the seconds a training step pays (`RegionTimes`) for running it under a SAC
    policy rather than under plain checkpoint (`overhead`: the policy's dispatch modes in its
    forward and its recompute and the op-stream check, `executor.sac.policy.Policy`
    recomputing every op, the same recompute as plain checkpoint's), and for running it under
    plain checkpoint rather than without (`checkpoint`: the recompute and checkpoint's own
    machinery: saving inputs and RNG state, the recompute's Python, the unpack hooks). Each
    region runs alone, forward and backward, on the inputs it gets in the step (`streams`: its
    recorded op stream, which the policy checks), the three ways side by side: after one
    warm-up of each, `repeats` rounds, the order rotated each round; the medians of the
    rounds' differences; fewer rounds (at least one) where `clock` leaves no time for more,
    its spare time shared evenly by the regions still to time. The thread count is the
    caller's. For a region that autograd or
    checkpoint refuses inside checkpoint, its error (a module that writes its input in place,
    such as an in-place ReLU, invalidates the input checkpoint keeps); any other error
    (out of memory, a bug) propagates. `measurer` (default `Measured`) times each region;
    in estimate mode it predicts them (`executor.sac.estimate.Estimate.region_times`).
    `calls`: each region's inputs (`region_inputs`), where the caller has them.
    """
    clock = clock or RecordingTime()
    measurer = measurer or Measured()
    calls = calls if calls is not None else region_inputs(model, regions, step)
    snapshot = Snapshot(model)
    out: list[RegionTimes | None] = []
    try:
        for j, (module, call) in enumerate(zip(regions, calls, strict=True)):
            if call is None:
                raise PlanError(f"region {j} ({type(module).__name__}) is not called by the step")

            try:
                rounds = clock.repeats(repeats, clock.spare.share(1 / (len(regions) - j)))
                out.append(measurer.region_times(module, call, f"region {j}", streams[j], rounds))
            except RuntimeError as e:
                if not _refused_by_checkpoint(e):
                    raise
                out.append(e)
    finally:
        snapshot.restore()
    return out


def pooled(
    times: list[RegionTimes | RuntimeError], kinds: list
) -> list[RegionTimes | RuntimeError]:
    """`times` with each region's `checkpoint` the median over the regions of its kind (module
    class and op stream: the same work, timed alone several times over), which halves or more
    the spread of one region's median on a shared machine."""
    groups: dict = {}
    for t, kind in zip(times, kinds, strict=True):
        if isinstance(t, RegionTimes):
            groups.setdefault(kind, []).append(t.checkpoint)
    return [
        t if isinstance(t, RuntimeError) else t._replace(checkpoint=statistics.median(groups[kind]))
        for t, kind in zip(times, kinds, strict=True)
    ]


def priced(block: SacBlock, times: RegionTimes | RuntimeError) -> SacBlock | None:
    """The block with its measured `overhead` and `price`, so that the modelled cost of the
    region recomputing every op is plain checkpoint's measured price: where that exceeds the
    recorded seconds of the ops a full recompute reruns (up to `stop`), `price` is the excess;
    where it is less (the recorded seconds, timed one op at a time, overestimate the rerun),
    those ops' seconds are scaled down to it and `price` is 0, so that a region saving some
    ops never costs less than the ops it reruns. None where the region fails inside
    checkpoint (`times` its error)."""
    if isinstance(times, RuntimeError):
        return None
    recompute = sum(op.seconds for op in block.ops[: block.stop + 1])
    if times.checkpoint >= recompute or recompute <= 0:
        price = max(times.checkpoint - recompute, 0.0)  # below 0 only within the timing's noise
        return replace(block, overhead=times.overhead, price=price)
    scale = max(times.checkpoint, 0.0) / recompute
    ops = tuple(
        replace(op, seconds=op.seconds * scale) if i <= block.stop else op
        for i, op in enumerate(block.ops)
    )
    return replace(block, ops=ops, overhead=times.overhead, price=0.0)


def measure_offload_seconds(rounds: int = 60, meter: DeviceMeter | None = None) -> float:
    """Seconds the runtime spends per offloaded op besides its copies (`SacProblem.
    offload_seconds`): a 4-op region (two matmuls and tanh, 16 KiB outputs) inside
    checkpoint, forward and backward, its 4 ops saved and offloaded against saved and kept,
    the two interleaved `rounds` times; the difference of the medians over 4, at least 0.
    Measured on `meter`'s device (default the CPU; the plan's, `checkpoint_plan`), timed by
    `DeviceMeter.now`: the runtime's Python (the pack, the cache entry's swap, the reload's
    issue and read) and the small copies, on CUDA the runtime's own (into pinned host memory
    on its copy streams, `executor.sac.offload.CopyStreams`), the device synchronized
    before each read of the clock."""
    meter = meter or DeviceMeter()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 32, generator=generator).to(meter.device).requires_grad_()
    w = torch.randn(32, 32, generator=generator).to(meter.device).requires_grad_()
    ops = ("aten.mm.default", "aten.tanh.default", "aten.mm.default", "aten.tanh.default")
    every = frozenset(range(len(ops)))
    policies = {
        "kept": Policy("probe", ops, every),
        "offloaded": Policy("probe", ops, every, every),
    }

    def region(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.tanh(a @ b) @ b)

    times: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(rounds):
        for name, policy in policies.items():
            start = meter.now()
            out = torch.utils.checkpoint.checkpoint(
                region, x, w, use_reentrant=False, context_fn=policy.contexts
            )
            out.sum().backward()
            times[name].append(meter.now() - start)
    extra = statistics.median(times["offloaded"]) - statistics.median(times["kept"])
    return max(extra, 0.0) / len(ops)
