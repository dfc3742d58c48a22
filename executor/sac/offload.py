"""A region's offloaded ops at runtime (NOTE [ SAC offload model ], solver/sac/memory.py;
docs/sac.md, "Offload"), and the measured device and host peaks of a step that offloads.

Torch's SAC keeps a MUST_SAVE op's outputs in its own cache (the forward mode's `storage`, read
back by the recompute mode), not among autograd's saved tensors: inside a checkpoint,
autograd's saves go to checkpoint's own `saved_tensors_hooks`, and a hook set inside the region
would take them from checkpoint, which would then not recompute them. So an offloaded op is
MUST_SAVE for SAC, and its cache entry is replaced by a host copy (`Offloaded`):

- pack, right after the op: the policy, which torch 2.13 calls after the op with its output
  (`ctx.op_output`), copies the output to the host (`HostCopies.pack`): on CUDA a non-blocking
  copy into pinned host memory on a side stream, on the CPU a separate host tensor (`clone()`,
  allocated inside the profiler scope `HOST_SCOPE`, so `measure_split` tells its bytes apart);
- the region's forward, at its end (`HostCopies.forward_done`), waits for its copies, puts
  each host copy in place of SAC's cache entry (SAC wrote it after the policy returned; the
  entry held the device source until now, as the model says) and refuses a source mutated
  since its op, as SAC refuses a mutated cache entry;
- the recompute, on entry, issues every reload of the call's entries in op order
  (`HostCopies.reload`; on CUDA on the side stream, an event each) and drops the host copies
  once copied; each entry's `get_val`, where the recompute reaches the op, waits for its reload
  and hands SAC the device tensor.

A region that is not checkpointed parks its saved storages with `SavedOnHost`, the
`saved_tensors_hooks` its forward runs under (a whole storage per pack, copied to the host at
the forward's end unless it is the region's output's, its views rebuilt at unpack on the
storage reloaded where the backward first reads it).

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

    def __init__(self, host: torch.Tensor, device: torch.device, copies: HostCopies) -> None:
        self.copies, self.device, self.version = copies, device, None
        self.host: torch.Tensor | None = host
        self.val: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None

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
    """The host copies of one checkpoint call's offloaded ops, in op order; on CUDA one side
    stream carries them (the model's copy engine, one per direction, in order). `caching`: SAC's
    forward mode of the call, whose cache entries the copies replace."""

    def __init__(self) -> None:
        self.caching: TorchDispatchMode | None = None
        self.pending: list[tuple[object, int, object]] = []  # (key, index, host copies)
        self.entries: list[Offloaded] = []
        self.streams: dict[torch.device, torch.cuda.Stream] = {}

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def pack(self, func, args: tuple, output: object) -> None:
        """Copy the output of the op SAC just ran (`func` on `args`) to the host, for the cache
        entry SAC writes next (its index: the call's count of `func` so far, less one)."""
        assert self.caching is not None
        key = _sac_storage_key(func, args)
        index = self.caching.func_counter[key] - 1
        hosts = tree_map(lambda t: self.to_host(t) if isinstance(t, torch.Tensor) else t, output)
        self.pending.append((key, index, hosts))

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of `tensor` (bytes: its storage's), issued now."""
        with _disable_current_modes(), torch.no_grad():
            if tensor.device.type == "cpu":
                with torch.profiler.record_function(HOST_SCOPE):
                    return tensor.detach().clone()
            stream = self._stream(tensor.device)
            host = torch.empty_like(tensor, device="cpu", pin_memory=True)
            stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(stream):
                host.copy_(tensor.detach(), non_blocking=True)
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

    def storage_to_host(self, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        """A host copy of a whole storage, issued now."""
        with _disable_current_modes(), torch.no_grad():
            if storage.device.type == "cpu":
                with torch.profiler.record_function(HOST_SCOPE):
                    return storage.clone()
            stream = self._stream(storage.device)
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=True)
            stream.wait_stream(torch.cuda.current_stream(storage.device))
            with torch.cuda.stream(stream):
                host.untyped_storage().copy_(storage, non_blocking=True)
            return host.untyped_storage()

    @staticmethod
    def storage_to_device(host: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
        """A device copy of a host storage, on the compute stream (read at once)."""
        with _disable_current_modes(), torch.no_grad():
            if device.type == "cpu":
                return host.clone()
            out = torch.empty(host.nbytes(), dtype=torch.uint8, device=device).untyped_storage()
            out.copy_(host, non_blocking=True)
            return out

    def forward_done(self) -> None:
        """The forward's end: wait for the copies, refuse a source mutated since its op, and
        put the host copies in place of SAC's cache entries (which held the sources)."""
        assert self.caching is not None
        for device, stream in self.streams.items():
            torch.cuda.current_stream(device).wait_stream(stream)
        for key, index, hosts in self.pending:
            storage = self.caching.storage[key]
            storage[index] = tree_map(self._offloaded, storage[index], hosts)
        self.pending = []

    def _offloaded(self, entry: object, host: object) -> object:
        if not isinstance(entry, _VersionWrapper) or not isinstance(entry.val, torch.Tensor):
            return entry
        if entry.val._version != entry.version:
            raise RuntimeError(
                "Tensor cached during selective activation checkpoint has been mutated (an "
                "offloaded op's output, after its copy to the host)"
            )
        offloaded = Offloaded(host, entry.val.device, self)
        self.entries.append(offloaded)
        return offloaded

    def reload(self) -> None:
        """The recompute's start: issue every reload, in op order."""
        for entry in self.entries:
            if entry.host is not None:
                entry.reload()


class _Forward:
    """SAC's forward mode; at exit, `HostCopies.forward_done`."""

    def __init__(self, caching: TorchDispatchMode, copies: HostCopies) -> None:
        self.caching, self.copies = caching, copies

    def __enter__(self) -> None:
        self.caching.__enter__()

    def __exit__(self, *exc) -> bool:
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
    forward: TorchDispatchMode, recompute: TorchDispatchMode, copies: HostCopies
) -> tuple[_Forward, _Recompute]:
    """SAC's context pair (`create_selective_checkpoint_contexts`) with the outputs the policy
    packed into `copies` moved to the host and back."""
    copies.caching = forward
    return _Forward(forward, copies), _Recompute(recompute, copies)


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


class _HostStorage:
    """One storage a region not checkpointed saves: the device storage (`source`) from its
    pack to the region's forward's end, then, unless it is the region's output's (which stays
    on the device), on the host (`park`) until autograd lets its saved tensors go; reloaded
    where the backward first reads it, held while the reads it was packed for are pending."""

    def __init__(self, storage: torch.UntypedStorage, copies: HostCopies) -> None:
        self.copies, self.device = copies, storage.device
        self.source: torch.UntypedStorage | None = storage  # until the forward's end
        self.host: torch.UntypedStorage | None = None  # from the forward's end
        self.reloaded: torch.UntypedStorage | None = None
        self.pending = 0

    def park(self) -> None:
        """Copy the storage to the host (issued now; the source is let go once it is done)."""
        assert self.source is not None
        self.host = self.copies.storage_to_host(self.source)

    def storage(self) -> torch.UntypedStorage:
        """The device storage, reloaded on the first pending read."""
        if self.source is not None:  # the region's output: never left the device
            return self.source
        if self.reloaded is None:
            assert self.host is not None
            self.reloaded = self.copies.storage_to_device(self.host, self.device)
        storage = self.reloaded
        self.pending -= 1
        if self.pending <= 0:
            self.reloaded = None
        return storage


class SavedOnHost:
    """`saved_tensors_hooks` for a region that is not checkpointed and offloads the storages its
    ops create that autograd saves (NOTE [ SAC offload model ]): pack records a saved tensor's
    whole storage once (its views share it) and returns the view's place in it; unpack
    rebuilds the view on the reloaded storage (the same offset, sizes and strides, so the
    backward's kernels see the layout they see eagerly). Tensors whose storage existed before
    the region (`existing`: its parameters, buffers and inputs) are saved as they are. At the
    forward's end (`forward_done`) the storages of the region's output stay on the device (they
    live on whatever the plan) and are never copied; every other recorded storage is copied to
    the host and its source let go. The copies wait for the forward's end because only then is
    the output known: a storage saved inside the region can turn out to be the output's (an
    in-place ReLU saves its result, the output of a torchvision ResNet block), and a copy of it
    at its pack would hold host bytes the model does not have (the output's, while the rest of
    the forward runs)."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        self.existing = {t.untyped_storage().data_ptr() for t in existing}
        self.copies = HostCopies()
        self.records: dict[int, _HostStorage] = {}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> object:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.existing or storage.nbytes() == 0:
            return tensor
        if ptr not in self.records:
            self.records[ptr] = _HostStorage(storage, self.copies)
        record = self.records[ptr]
        record.pending += 1
        return record, tensor.dtype, tensor.storage_offset(), tensor.size(), tensor.stride()

    @staticmethod
    def unpack(packed: object) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        record, dtype, offset, size, stride = packed
        view = torch.empty(0, dtype=dtype, device=record.device)
        return view.set_(record.storage(), offset, size, stride)

    def forward_done(self, output: object) -> None:
        """The forward's end: the output's storages stay on the device, uncopied; every other
        recorded storage is copied to the host (in pack order), the copies waited for, and its
        source let go."""
        kept = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves(output)
            if isinstance(t, torch.Tensor)
        }
        parked = [record for ptr, record in self.records.items() if ptr not in kept]
        for record in parked:
            record.park()
        for device, stream in self.copies.streams.items():
            torch.cuda.current_stream(device).wait_stream(stream)
        for record in parked:
            record.source = None
        self.records = {}
