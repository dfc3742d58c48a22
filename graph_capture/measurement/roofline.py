"""An op's predicted seconds on a target device (`solver.target.Device`), from the op itself.

FLOPs come from ``torch.utils.flop_counter``'s registry (matmuls, convolutions, attention; every
other op counts 0 FLOPs and is bound by the bytes it moves). Bytes moved are the bytes of the
op's distinct tensor inputs and outputs (each storage counted once). Both work on fake tensors,
so a step that never ran here gets seconds. ``cpu_device`` measures this processor's matmul rate,
copy bandwidth and fixed seconds per op once per process, so that target ``cpu`` is a device like
the others.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import flop_registry

from graph_capture.measurement.timing import median_seconds
from solver.target import Device, builtin_device, op_key
from solver.target.devices import is_device_file

__all__ = [
    "bytes_moved",
    "cpu_device",
    "is_view",
    "op_flops",
    "op_seconds",
    "resolve_target",
    "target_key",
]


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


_SAME_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: (
        torch.ops.aten._scaled_dot_product_flash_attention
    ),
}
"""Ops torch's flop counter has no formula for, counted as the op whose arguments they share
(SDPA's fused CPU kernel: the query, key and value first, as the CUDA flash kernel's)."""


def op_flops(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one call of ``func`` (0 where torch's flop counter has no formula)."""
    packet = func.overloadpacket
    count = flop_registry.get(_SAME_FLOPS.get(packet, packet))
    if count is None:
        return 0
    return int(count(*args, **kwargs, out_val=out))


def bytes_moved(args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes the op reads and writes: its distinct input and output tensors' bytes."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in _tensors((args, kwargs, out)):
        key = (StorageWeakRef(t.untyped_storage()).cdata, t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def target_key(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """The op's key in a device's measured table (`solver.target.op_key`)."""
    inputs = _tensors((args, kwargs))
    return op_key(str(func), [tuple(t.shape) for t in inputs], [str(t.dtype)[6:] for t in inputs])


def op_dtype(args: tuple, kwargs: dict, out: Any) -> str:
    """The dtype an op computes in: its first floating input's (else its output's)."""
    for t in _tensors((args, kwargs, out)):
        if t.is_floating_point():
            return str(t.dtype)[6:]
    return "float32"


_VIEWS_BY_CONTRACT = frozenset({torch.ops.aten._unsafe_view.default})
"""Ops that return a view although their schemas do not say so (`_unsafe_view`: a view whose
autograd forgets its base)."""


def is_view(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> bool:
    """Whether the call only views existing memory (no kernel, no bytes moved): a view op (its
    schema's alias annotation, or `_VIEWS_BY_CONTRACT`) whose outputs all lie in its inputs'
    storages (``reshape`` copies where it cannot view)."""
    if not (func.is_view or func in _VIEWS_BY_CONTRACT):
        return False
    inputs = {StorageWeakRef(t.untyped_storage()) for t in _tensors((args, kwargs))}
    return all(StorageWeakRef(t.untyped_storage()) in inputs for t in _tensors(out))


def op_seconds(
    device: Device, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any
) -> float:
    """Predicted seconds of one call of ``func`` on ``device``: a view's `Device.view_seconds`,
    another op's `Device.seconds`."""
    if is_view(func, args, kwargs, out):
        return device.view_seconds(target_key(func, args, kwargs))
    return device.seconds(
        target_key(func, args, kwargs),
        op_flops(func, args, kwargs, out),
        bytes_moved(args, kwargs, out),
        op_dtype(args, kwargs, out),
    )


TINY_OP_REPEATS = 201


@functools.cache
def cpu_device() -> Device:
    """This processor as a device: matmul FLOP/s per dtype, copy bandwidth and the fixed
    seconds of an op (`TINY_OP_REPEATS` runs of a one-element add: dispatch, allocation and
    Python call), measured once (medians; a 512x512 matmul and a 64 MiB copy, at torch's current
    thread count); memory is unbounded for the model (bytes are what a plan budgets), rounding
    1 byte, aten's CPU kernels (`graph_capture.measurement.workspace`)."""
    flops = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        a = torch.randn(512, 512, dtype=dtype)
        seconds = median_seconds(lambda a=a: a @ a)
        flops[str(dtype)[6:]] = 2 * 512**3 / seconds
    src = torch.empty(1 << 24, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() * src.element_size() / seconds
    one = torch.ones(1)
    overhead = median_seconds(lambda: one + one, repeats=TINY_OP_REPEATS, warmup=10)
    return Device(
        "cpu",
        flops,
        bandwidth=bandwidth,
        memory=1 << 62,
        rounding=1,
        op_overhead=overhead,
        kernels="cpu",
    )


def resolve_target(target: str | Device) -> Device:
    """A `Device` from a built-in name, ``"cpu"``, a device file's path, or a `Device`."""
    if isinstance(target, Device):
        return target
    if target.lower() == "cpu":
        return cpu_device()
    if is_device_file(target):
        return Device.load(target)
    return builtin_device(target)
