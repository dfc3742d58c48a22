"""A region's offloaded ops at runtime (NOTE [ SAC offload model ], solver/sac/memory.py;
docs/sac.md, "Offload"), and the measured device and host peaks of a step that offloads.

Torch's SAC keeps a MUST_SAVE op's outputs in its own cache (the forward mode's `storage`, read
back by the recompute mode), not among autograd's saved tensors: inside a checkpoint,
autograd's saves go to checkpoint's own `saved_tensors_hooks`, and a hook set inside the region
would take them from checkpoint, which would then not recompute them. So an offloaded op is
MUST_SAVE for SAC, and its cache entry is replaced by a host copy (`Offloaded`):

- pack, right after the op: the policy, which torch 2.13 calls after the op with its output
  (`ctx.op_output`), copies the output to the host (`HostCopies.pack`): on CUDA a non-blocking
  copy into pinned host memory on the device-to-host stream, on the CPU a separate host tensor
  (`clone()`, allocated inside the profiler scope `HOST_SCOPE`, so `measure_split` tells its
  bytes apart);
- the region's forward, at its end (`HostCopies.forward_done`), waits for its copies, puts
  each host copy in place of SAC's cache entry (SAC wrote it after the policy returned; the
  entry held the device source until now, as the model says) and refuses a source mutated
  since its op, as SAC refuses a mutated cache entry;
- the recompute, on entry, issues every reload of the call's entries in op order
  (`HostCopies.reload`; on CUDA on the host-to-device stream, an event each); each entry's
  `get_val`, where the recompute reaches the op, makes the compute stream wait for its reload
  and hands SAC the device tensor, and the host copy is let go.

A region that is not checkpointed parks its saved storages with `SavedOnHost`, the
`saved_tensors_hooks` its forward runs under (a whole storage per pack, copied to the host at
the forward's end unless it is the region's output's, its views rebuilt at unpack on the
storage reloaded where the backward first reads it).

Every copy goes through `CopyStreams`: per CUDA device one device-to-host and one host-to-device
stream, shared by all the plan's regions (the model's two in-order copy engines); it says how
a source and a reload's device tensor are kept from the compute stream until their copy ends.

A copy is exact (`copy_`/`clone` of the same dtype and layout), so gradients are bit for bit
those of the plan without offload, and of eager. The CUDA path is written for, not run here:
`tests/test_sac_offload_streams.py` checks the calls it issues, with a recording fake of the
CUDA calls (`TorchCuda`), on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import _sac_storage_key, _VersionWrapper

from executor.errors import BackwardError
from executor.storage_views import View, storage_bytes

HOST_SCOPE = "remat.sac.host_copy"
"""The profiler scope (`record_function`) the CPU host copies are allocated in."""


class TorchCuda:
    """The CUDA calls `CopyStreams` makes, each one line over `torch.cuda` and the tensor API
    (a test passes a fake with the same methods that records them). Streams returned here
    have `wait_stream` and `wait_event`, events `record`."""

    def streams(self, device: torch.device) -> bool:
        """Whether copies to and from `device` run on streams (a CUDA device)."""
        return device.type == "cuda"

    def new_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device)

    def current_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def use(self, stream: torch.cuda.Stream) -> torch.cuda.StreamContext:
        """The context in which `stream` is the current stream."""
        return torch.cuda.stream(stream)

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        """An uninitialised pinned host tensor of `tensor`'s dtype, shape and strides."""
        return torch.empty_like(tensor, device="cpu", pin_memory=True)

    def empty_like(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor like `tensor` on `device`, from the current stream's pool."""
        return torch.empty_like(tensor, device=device)

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        """`source` copied into `target`, issued on the current stream."""
        target.copy_(source, non_blocking=True)

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        """The caching allocator keeps `tensor`'s block from reuse, once it is freed, until
        the work issued on `stream` by then has ended."""
        tensor.record_stream(stream)


class CopyStreams:
    """The copy engines of SAC offload. On each CUDA device, one device-to-host stream and one
    host-to-device stream, each carrying its copies one at a time in issue order: the two FIFO
    engines of NOTE [ SAC offload model ]. One `CopyStreams` serves every region of a plan and
    every checkpoint call of a step (`CheckpointPlan.apply` makes one; a deep copy of the model
    shares it): each region's forward waits for its own copies out at its end, and each
    reload is read before the next region's reloads are issued, so the engine a region's
    copies find is idle, as the model's per-region timeline has it. On the CPU a copy is
    synchronous (`clone`; a host copy allocated inside `HOST_SCOPE`). `cuda`: the CUDA calls
    (`TorchCuda()` by default).

    A copy out (`to_host`) is issued on the device-to-host stream after the compute stream's
    work so far (which wrote the source), into pinned memory, and the source is recorded to
    that stream (`record_stream`): whenever the forward drops it, its block is not handed to
    the compute stream until the copy has read it. A reload (`to_device`) allocates its
    device tensor on the compute stream (its block returns to the compute stream's pool: one
    allocated on a side stream would be held back from it, while `max_memory_allocated` counts
    it the same), then the host-to-device stream waits for the compute stream's work so far
    (the block's earlier users) and copies into it; the tensor is recorded to that stream, so
    that freed unread it waits for the copy. Each copy records an event; the compute stream
    waits for it (`wait`) before the host copy replaces the source (copies out) or the device
    tensor is read (reloads)."""

    def __init__(self, cuda: TorchCuda | None = None) -> None:
        self.cuda = TorchCuda() if cuda is None else cuda
        self.d2h: dict[torch.device, torch.cuda.Stream] = {}
        self.h2d: dict[torch.device, torch.cuda.Stream] = {}

    def __deepcopy__(self, memo: dict) -> CopyStreams:
        return self  # a device's engines are the process's, whichever model copy runs

    def to_host(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A host copy of `source` (bytes: its storage's, for a dense tensor), issued now, and
        the event its copy ends at (None on the CPU, where the copy is done on return)."""
        cuda = self.cuda
        with _disable_current_modes(), torch.no_grad():
            source = source.detach()
            if not cuda.streams(source.device):
                with torch.profiler.record_function(HOST_SCOPE):
                    return source.clone(), None
            stream = self._stream(self.d2h, source.device)
            host = cuda.pinned_like(source)
            stream.wait_stream(cuda.current_stream(source.device))
            with cuda.use(stream):
                cuda.copy(host, source)
            cuda.record_stream(source, stream)
            return host, self._event(stream)

    def to_device(
        self, host: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A copy of `host` on `device`, issued now, and the event its copy ends at (None on
        the CPU, where the copy is done on return)."""
        cuda = self.cuda
        with _disable_current_modes(), torch.no_grad():
            if not cuda.streams(device):
                return host.clone(), None
            compute = cuda.current_stream(device)
            target = cuda.empty_like(host, device)
            stream = self._stream(self.h2d, device)
            stream.wait_stream(compute)
            with cuda.use(stream):
                cuda.copy(target, host)
            cuda.record_stream(target, stream)
            return target, self._event(stream)

    def wait(self, event: torch.cuda.Event | None, device: torch.device) -> None:
        """Make `device`'s compute stream wait for the copy that ends at `event` (None: a copy
        done on return)."""
        if event is not None:
            self.cuda.current_stream(device).wait_event(event)

    def _stream(
        self, streams: dict[torch.device, torch.cuda.Stream], device: torch.device
    ) -> torch.cuda.Stream:
        if device not in streams:
            streams[device] = self.cuda.new_stream(device)
        return streams[device]

    def _event(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = self.cuda.new_event()
        event.record(stream)
        return event


class Offloaded(_VersionWrapper):
    """A SAC cache entry held on the host: `host` from the pack until its reload has arrived,
    `val` (the reloaded device tensor) from the reload until SAC reads it (`get_val`),
    `event` the reload's end (None on the CPU)."""

    def __init__(self, host: torch.Tensor, device: torch.device, streams: CopyStreams) -> None:
        self.streams, self.device, self.version = streams, device, None
        self.host: torch.Tensor | None = host
        self.val: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None

    def reload(self) -> None:
        """Copy the host tensor back to the device (issued now; on CUDA on the host-to-device
        stream, the host tensor held until the compute stream waited for it)."""
        assert self.host is not None
        self.val, self.event = self.streams.to_device(self.host, self.device)
        self.host = None if self.event is None else self.host

    def get_val(self, allow_cache_entry_mutation: bool) -> torch.Tensor:
        """The reloaded device tensor, the compute stream made to wait for its copy."""
        if self.val is None:
            raise BackwardError(
                "an offloaded SAC cache entry was read before its reload: the recompute ran "
                "without the plan's recompute context"
            )
        val, self.val = self.val, None
        self.streams.wait(self.event, self.device)
        self.host = self.event = None
        return val


class HostCopies:
    """The host copies of one checkpoint call's offloaded ops, in op order, or of a region's
    parked storages, on `streams` (shared by the plan's regions). `caching`: SAC's forward
    mode of the call, whose cache entries the copies replace; `copying`: the copies out not
    yet waited for (device, event)."""

    def __init__(self, streams: CopyStreams) -> None:
        self.streams = streams
        self.caching: TorchDispatchMode | None = None
        self.pending: list[tuple[object, int, object]] = []  # (key, index, host copies)
        self.copying: list[tuple[torch.device, torch.cuda.Event]] = []
        self.entries: list[Offloaded] = []

    def pack(self, func, args: tuple, output: object) -> None:
        """Copy the output of the op SAC just ran (`func` on `args`) to the host, for the cache
        entry SAC writes next (its index: the call's count of `func` so far, less one)."""
        assert self.caching is not None
        key = _sac_storage_key(func, args)
        index = self.caching.func_counter[key] - 1
        hosts = tree_map(lambda t: self.to_host(t) if isinstance(t, torch.Tensor) else t, output)
        self.pending.append((key, index, hosts))

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of `tensor`, issued now (waited for by `copies_done`)."""
        host, event = self.streams.to_host(tensor)
        if event is not None:
            self.copying.append((tensor.device, event))
        return host

    def copies_done(self) -> None:
        """Make the compute stream wait for every copy out issued so far."""
        for device, event in self.copying:
            self.streams.wait(event, device)
        self.copying = []

    def forward_done(self) -> None:
        """The forward's end: wait for the copies, refuse a source mutated since its op, and
        put the host copies in place of SAC's cache entries (which held the sources)."""
        assert self.caching is not None
        self.copies_done()
        for key, index, hosts in self.pending:
            storage = self.caching.storage[key]
            storage[index] = tree_map(self._offloaded, storage[index], hosts)
        self.pending = []

    def _offloaded(self, entry: object, host: object) -> object:
        if not isinstance(entry, _VersionWrapper) or not isinstance(entry.val, torch.Tensor):
            return entry
        if entry.val._version != entry.version:
            raise BackwardError(
                "Tensor cached during selective activation checkpoint has been mutated (an "
                "offloaded op's output, after its copy to the host)"
            )
        offloaded = Offloaded(host, entry.val.device, self.streams)
        self.entries.append(offloaded)
        return offloaded

    def reload(self) -> None:
        """The recompute's start: issue every reload, in op order."""
        for entry in self.entries:
            if entry.host is not None and entry.val is None:
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
    """A step's measured peaks, the host copies told apart: `device_peak` (bytes live at once
    above the start, host copies left out), `host_peak` (bytes of the host copies live at
    once), and `total_peak` (everything, as `executor.measure_peak` reports it)."""

    device_peak: int
    host_peak: int
    total_peak: int


def measure_split(fn) -> SplitPeak:
    """Run `fn()` once on the CPU under the profiler's allocation events: an allocation made
    inside `HOST_SCOPE` is a host copy until its address is freed, every other is the device's
    (bytes above the start; a CPU run's "device" is the same allocator, told apart by scope)."""
    from graph_capture.measurement.peak import event_tree, is_allocation, memory_profile

    with memory_profile() as prof:
        result = fn()
        del result
    events = [
        (node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr, inside)
        for node, inside in event_tree(prof, HOST_SCOPE)
        if is_allocation(node)
    ]
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
        self.host: torch.Tensor | None = None  # its bytes, from the forward's end
        self.reloaded: torch.UntypedStorage | None = None
        self.pending = 0

    def park(self) -> None:
        """Copy the storage to the host (issued now; the source is let go once the compute
        stream waited for it, `HostCopies.copies_done`)."""
        assert self.source is not None
        self.host = self.copies.to_host(storage_bytes(self.source))

    def storage(self) -> torch.UntypedStorage:
        """The device storage, reloaded on the first pending read (read at once: the compute
        stream waits for the reload here)."""
        if self.source is not None:  # the region's output: never left the device
            return self.source
        if self.reloaded is None:
            assert self.host is not None
            streams = self.copies.streams
            reloaded, event = streams.to_device(self.host, self.device)
            streams.wait(event, self.device)
            self.reloaded = reloaded.untyped_storage()
        storage = self.reloaded
        self.pending -= 1
        if self.pending <= 0:
            self.reloaded = None
        return storage


class SavedOnHost:
    """`saved_tensors_hooks` for a region that is not checkpointed and offloads the storages its
    ops create that autograd saves (NOTE [ SAC offload model ]), its copies on `streams`: pack
    records a saved tensor's whole storage once (its views share it) and returns the view's
    place in it; unpack rebuilds the view on the reloaded storage (the same offset, sizes and
    strides, so the backward's kernels see the layout they see eagerly). Tensors whose storage
    existed before the region (`existing`: its parameters, buffers and inputs) are saved as
    they are. At the forward's end (`forward_done`) the storages of the region's output stay on
    the device (they live on whatever the plan) and are never copied; every other recorded
    storage is copied to the host and its source let go. The copies wait for the forward's end
    because only then is the output known: a storage saved inside the region can turn out to
    be the output's (an in-place ReLU saves its result, the output of a torchvision ResNet
    block), and a copy of it at its pack would hold host bytes the model does not have (the
    output's, while the rest of the forward runs)."""

    def __init__(self, existing: list[torch.Tensor], streams: CopyStreams) -> None:
        self.existing = {t.untyped_storage().data_ptr() for t in existing}
        self.copies = HostCopies(streams)
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
        return record, View.of(tensor)

    @staticmethod
    def unpack(packed: object) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        record, view = packed
        return view.on(record.storage())

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
        self.copies.copies_done()
        for record in parked:
            record.source = None
        self.records = {}
