"""A region's offloaded ops at runtime (NOTE [ SAC offload model ], solver/sac/memory.py;
docs/sac.md, "Offload"), and the measured device and host peaks of a step that offloads.

Torch's SAC keeps a MUST_SAVE op's outputs in its own cache (the forward mode's `storage`, read
back by the recompute mode), not among autograd's saved tensors: inside a checkpoint,
autograd's saves go to checkpoint's own `saved_tensors_hooks`, and a hook set inside the region
would take them from checkpoint, which would then not recompute them. So an offloaded op is
MUST_SAVE for SAC, and its cache entry is replaced, right after the op, by a host copy
(`Offloaded`):

- pack, right after the op (`_Offloading`, a dispatch mode inside SAC's forward mode, finds
  the entry SAC just wrote): on CUDA a non-blocking copy into pinned host memory on a side
  stream, on the CPU a separate host tensor (`clone()`, allocated inside the profiler scope
  `HOST_SCOPE`, so `measure_split` tells its bytes apart);
- the region's forward, at its end, waits for its copies (`HostCopies.forward_done`): the
  device source lives until then, as the model says, and a source mutated since its op is
  refused as SAC refuses a mutated cache entry;
- the recompute, on entry, issues every reload of the call's entries in op order
  (`HostCopies.reload`; on CUDA on the side stream, an event each) and drops the host copies
  once copied; each entry's `get_val`, where the recompute reaches the op, waits for its reload
  and hands SAC the device tensor.

A copy is exact (`copy_`/`clone` of the same dtype and layout), so gradients are bit for bit
those of the plan without offload, and of eager. The CUDA path is written for, not run here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import _sac_storage_key, _VersionWrapper

HOST_SCOPE = "remat.sac.host_copy"
"""The profiler scope (`record_function`) the CPU host copies are allocated in."""


class Offloaded(_VersionWrapper):
    """A SAC cache entry held on the host: `host` from the pack until its reload, `val` (the
    reloaded device tensor) from the reload until SAC reads it (`get_val`)."""

    def __init__(self, entry: _VersionWrapper, copies: HostCopies) -> None:
        self.copies, self.version = copies, entry.version
        self.source: torch.Tensor | None = entry.val
        self.device = entry.val.device
        self.val: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None
        self.host: torch.Tensor | None = copies.to_host(entry.val)

    def reload(self) -> None:
        """Copy the host tensor back to the device (on CUDA: issued on the side stream)."""
        assert self.host is not None
        self.val, self.event = self.copies.to_device(self.host, self.device)
        self.host = None if self.event is None else self.host

    def get_val(self, allow_cache_entry_mutation: bool) -> torch.Tensor:
        """The reloaded device tensor, once its copy has arrived."""
        if self.val is None:
            raise RuntimeError(
                "an offloaded SAC cache entry was read before its reload: the recompute ran "
                "without the plan's recompute context"
            )
        val, self.val = self.val, None
        if self.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self.event)
            val.record_stream(stream)
            self.host = self.event = None
        return val


class HostCopies:
    """The host copies of one checkpoint call's offloaded entries, in op order; on CUDA one
    side stream carries them (the model's copy engine, one per direction in order)."""

    def __init__(self) -> None:
        self.entries: list[Offloaded] = []
        self.streams: dict[torch.device, torch.cuda.Stream] = {}

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def offload(self, entry: object) -> object:
        """The cache entry leaf with its tensor moved to the host (others as they are)."""
        if not isinstance(entry, _VersionWrapper) or not isinstance(entry.val, torch.Tensor):
            return entry
        offloaded = Offloaded(entry, self)
        self.entries.append(offloaded)
        return offloaded

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of `tensor` (bytes: its storage's), issued now."""
        with _disable_current_modes(), torch.no_grad():
            if tensor.device.type == "cpu":
                with torch.profiler.record_function(HOST_SCOPE):
                    return tensor.clone()
            stream = self._stream(tensor.device)
            host = torch.empty_like(tensor, device="cpu", pin_memory=True)
            stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(stream):
                host.copy_(tensor, non_blocking=True)
            return host

    def to_device(
        self, host: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A device copy of `host`, issued now, and the event its copy ends at (None on the
        CPU, where the copy is done on return)."""
        with _disable_current_modes(), torch.no_grad():
            if device.type == "cpu":
                return host.clone(), None
            stream = self._stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                val = host.to(device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            return val, event

    def forward_done(self) -> None:
        """The forward's end: wait for the copies, refuse a source mutated since its op, and
        let the sources go."""
        for device, stream in self.streams.items():
            torch.cuda.current_stream(device).wait_stream(stream)
        for entry in self.entries:
            if entry.source is not None and entry.source._version != entry.version:
                raise RuntimeError(
                    "Tensor cached during selective activation checkpoint has been mutated "
                    "(an offloaded op's output, after its copy to the host)"
                )
            entry.source = None

    def reload(self) -> None:
        """The recompute's start: issue every reload, in op order."""
        for entry in self.entries:
            if entry.host is not None:
                entry.reload()


class _Offloading(TorchDispatchMode):
    """Inside SAC's forward mode: after each op the policy marked (`marked`), the cache entry
    SAC just wrote for it is replaced by its host copy."""

    def __init__(self, caching: TorchDispatchMode, marked: list[int], copies: HostCopies):
        super().__init__()
        self.caching, self.marked, self.copies = caching, marked, copies

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.marked:
            self.marked.clear()
            key = _sac_storage_key(func, args)
            storage = self.caching.storage[key]
            index = self.caching.func_counter[key] - 1
            storage[index] = tree_map(self.copies.offload, storage[index])
        return out


class _Forward:
    """SAC's forward mode with `_Offloading` inside it; at exit, `HostCopies.forward_done`."""

    def __init__(self, caching: TorchDispatchMode, marked: list[int], copies: HostCopies):
        self.caching, self.copies = caching, copies
        self.inner = _Offloading(caching, marked, copies)

    def __enter__(self) -> None:
        self.caching.__enter__()
        self.inner.__enter__()

    def __exit__(self, *exc) -> bool:
        try:
            self.inner.__exit__(*exc)
        finally:
            self.caching.__exit__(*exc)
        if exc[0] is None:
            self.copies.forward_done()
        return False


class _Recompute:
    """SAC's recompute mode, entered after every reload of the call is issued."""

    def __init__(self, cached: TorchDispatchMode, copies: HostCopies) -> None:
        self.cached, self.copies = cached, copies

    def __enter__(self) -> None:
        self.copies.reload()
        self.cached.__enter__()

    def __exit__(self, *exc) -> bool:
        return bool(self.cached.__exit__(*exc))


def offloading_contexts(
    forward: TorchDispatchMode, recompute: TorchDispatchMode, marked: list[int]
) -> tuple[_Forward, _Recompute]:
    """SAC's context pair (`create_selective_checkpoint_contexts`) with the ops the policy
    appends to `marked` (as it marks them MUST_SAVE) moved to the host and back."""
    copies = HostCopies()
    return _Forward(forward, marked, copies), _Recompute(recompute, copies)


@dataclass(frozen=True)
class SplitPeak:
    """A step's measured peaks, the host copies told apart: `device` (bytes live at once above
    the start, host copies left out), `host` (bytes of the host copies live at once), and
    `total` (everything, as `executor.measure_peak` reports it)."""

    device: int
    host: int
    total: int


def measure_split(fn) -> SplitPeak:
    """Run `fn()` once on the CPU under the profiler's allocation events: an allocation made
    inside `HOST_SCOPE` is a host copy until its address is freed, every other is the device's
    (bytes above the start; a CPU run's "device" is the same allocator, told apart by scope)."""
    from torch._C._profiler import _EventType

    from graph_capture.measurement.peak import memory_profile

    with memory_profile() as prof:
        result = fn()
        del result
    events: list[tuple[int, int, int, bool]] = []
    stack = [(node, False) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, inside = stack.pop()
        inside = inside or node.name == HOST_SCOPE
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            fields = node.extra_fields
            events.append((node.start_time_ns, fields.alloc_size, fields.ptr, inside))
        stack.extend((child, inside) for child in node.children)
    events.sort(key=lambda e: e[0])
    host_ptrs: set[int] = set()
    device = host = total = device_peak = host_peak = total_peak = 0
    for _, size, ptr, inside in events:
        total += size
        if (size > 0 and inside) or (size < 0 and ptr in host_ptrs):
            host += size
            (host_ptrs.add if size > 0 else host_ptrs.discard)(ptr)
        else:
            device += size
        device_peak, host_peak = max(device_peak, device), max(host_peak, host)
        total_peak = max(total_peak, total)
    return SplitPeak(device_peak, host_peak, total_peak)
