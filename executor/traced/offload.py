"""Run a schedule's offload and reload ops (docs/offload.md): copies of values to host memory.

`("offload", v)` copies the live values of DAG node v's fx nodes to the host; the device values
are dropped at the schedule's ``("free", v)`` as usual. `("reload", v)` copies them back into
new device memory. The copies are exact: each distinct storage the values use is copied byte
for byte, and every value is rebuilt on the copy with its own dtype, shape, strides and storage
offset, so views, aliases within the node, non-contiguous tensors and every dtype come back
bit-identical. A storage that a placeholder (parameter, buffer, input, tangent) owns is not
copied: it stays on the device for the whole step anyway, and the value keeps viewing it.

Where the copies go, `HostPool`:

- CUDA: pinned host buffers (one per copy, its storages back to back, sized as torch's
  pinned allocator rounds it); each copy runs on its direction's stream (one per direction, so
  copies of a direction run in issue order, as the `Link`'s one engine per direction), after
  the compute stream's work issued before it, and records an event. The compute stream waits
  for the offload's event before the source is freed (the source lives until its copy ends),
  and for the reload's event before the reloaded value is first read or freed.
- CPU: host buffers that numpy allocates, outside torch's c10 CPU allocator: the copies are
  synchronous, and the profiler's allocation events (`executor.memory.measure_peak`) see the
  device side alone (values, reload destinations, workspaces), while the pool counts the
  host side. Both are the same physical memory here; the split is the one a GPU has.

The mechanism is one code path: only where a host buffer comes from and whether a copy runs on
a side stream with an event differ by device.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy
import torch
import torch.utils._pytree as pytree

from executor.errors import UnsupportedScheduleError
from executor.storage_views import View, storage_bytes
from solver.core.link import Link, host_block_bytes

__all__ = ["HostCopy", "HostPool", "StepCopies", "Transfers", "link_on", "static_storages"]


@dataclass
class HostPool:
    """The host memory offloaded copies occupy, in bytes.

    `host_held`: bytes of host buffers held now, each counted as the host allocator takes it
    (`rounding`); `host_peak`: the most held at once since the pool was made or
    `reset_peak`. `Transfers` holds a copy from its offload op until the compute stream has
    waited for its value's last reload (through the offload op where never reloaded), the span
    `solver.simulate` charges to the host; so a step's `host_peak` is the schedule's predicted
    host peak (``Simulation.host_peak``) where the schedule's link has the pool's `rounding`.

    Pinned (CUDA): each buffer is a block of torch's pinned memory of its rounded size
    (``"power-of-two"``, as torch's CachingHostAllocator rounds; `solver.core.link`); a
    released block stays in the pool with the event of the last copy that used it, and is
    handed out again for a buffer of its size only once that event has completed. Not pinned
    (CPU): numpy memory of exactly the bytes asked (``"exact"``), dropped when released.
    """

    pinned: bool = False
    host_held: int = 0
    host_peak: int = 0
    _idle: dict[int, list[tuple[torch.Tensor, torch.cuda.Event | None]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def rounding(self) -> str:
        """How the pool sizes a buffer (`solver.core.link.HOST_ROUNDINGS`)."""
        return "power-of-two" if self.pinned else "exact"

    def block_bytes(self, nbytes: int) -> int:
        """Host bytes a buffer of `nbytes` bytes takes."""
        return host_block_bytes(nbytes, self.rounding)

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A host buffer of `nbytes` bytes (uint8), counted as held at `block_bytes(nbytes)`:
        pinned memory where `pinned` (CUDA), else numpy's memory (outside torch's CPU
        allocator)."""
        size = self.block_bytes(nbytes)
        if self.pinned:
            block = self._reuse(size)
            if block is None:
                block = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            buffer = block[:nbytes]
        else:
            buffer = torch.from_numpy(numpy.empty(nbytes, dtype=numpy.uint8))
        self.host_held += size
        self.host_peak = max(self.host_peak, self.host_held)
        return buffer

    def release(self, buffer: torch.Tensor, after: torch.cuda.Event | None = None) -> None:
        """`buffer` (from `allocate`) is no longer held; `after`: the event of the last copy
        that reads or writes it (CUDA), which a later buffer from its block waits for."""
        self.host_held -= self.block_bytes(buffer.numel())
        if self.pinned:  # the whole block: its storage is the rounded size allocated
            block = storage_bytes(buffer.untyped_storage())
            self._idle.setdefault(block.numel(), []).append((block, after))

    def _reuse(self, size: int) -> torch.Tensor | None:
        """An idle block of `size` bytes, once the last copy that used it has ended."""
        idle = self._idle.get(size)
        if not idle:
            return None
        block, event = idle.pop()
        if event is not None and not event.query():
            event.synchronize()
        return block

    def reset_peak(self) -> None:
        """Start a new peak from the bytes held now."""
        self.host_peak = self.host_held


def link_on(link: Link | None, device: torch.device) -> Link | None:
    """`link` with the host rounding of the pool `Transfers` copies into on `device` (pinned
    on CUDA, numpy memory elsewhere): a schedule solved over it predicts the pool's peak."""
    if link is None:
        return None
    return dataclasses.replace(link, host_rounding=HostPool(pinned=device.type == "cuda").rounding)


@dataclass
class HostCopy:
    """The host copy of one DAG node's values in one step.

    `buffer`: one host buffer holding every distinct storage copied, back to back; `spans`:
    each storage's (offset, bytes) in it. `treespec`, `leaves`: the values as a pytree; a leaf
    is ``("copied", span index, View)`` (`executor.storage_views.View`: its place in the
    storage), ``("kept", tensor)`` (a view of a placeholder's storage) or
    ``("constant", object)``. `offloaded`: the CUDA
    event of its device-to-host copy (None on CPU, where it has ended).
    """

    buffer: torch.Tensor
    spans: list[tuple[int, int]]
    treespec: pytree.TreeSpec
    leaves: list[tuple]
    offloaded: torch.cuda.Event | None


@dataclass
class StepCopies:
    """One step's copies: host copies and reloads done so far, by DAG node; the copies the
    compute stream has yet to wait for: a node's offload (before its source is freed; CUDA
    events) and the reload that made its device values (before they are read or freed; the
    event, None on CPU); and the host copies whose last reload is one of those (released to
    the pool once the compute stream has waited for it)."""

    host: dict[Hashable, HostCopy] = field(default_factory=dict)
    reloads: dict[Hashable, int] = field(default_factory=dict)
    offloading: dict[Hashable, torch.cuda.Event] = field(default_factory=dict)
    arriving: dict[Hashable, torch.cuda.Event | None] = field(default_factory=dict)
    releasing: dict[Hashable, HostCopy] = field(default_factory=dict)


class Transfers:
    """The offload and reload ops of one schedule's steps on `device`, their host copies in
    `pool` (a new one by default).

    `reloads`: how many reload ops the schedule has of each DAG node: a host copy is released
    once the compute stream has waited for its node's last reload of the step (`ready`), at
    the offload where the node has none.
    """

    def __init__(
        self, device: torch.device, reloads: Mapping[Hashable, int], pool: HostPool | None = None
    ) -> None:
        if device.type not in ("cpu", "cuda"):
            raise UnsupportedScheduleError(
                f"the schedule offloads values to the host, and this executor copies them from "
                f"CPU or CUDA devices only, not {device.type}: solve without offload (no link)"
            )
        self.device = device
        self.reloads = dict(reloads)
        cuda = device.type == "cuda"
        self.pool = HostPool(pinned=cuda) if pool is None else pool
        self._d2h = torch.cuda.Stream(device) if cuda else None
        self._h2d = torch.cuda.Stream(device) if cuda else None

    def offload(
        self, copies: StepCopies, node: Hashable, values: Mapping[int, object], static: set[int]
    ) -> None:
        """Copy `values` (node's live fx values by slot) to new host buffers. `static`: data
        pointers of the placeholders' storages, which are not copied."""
        leaves, treespec = pytree.tree_flatten(dict(values))
        index: dict[int, int] = {}
        sources: list[torch.Tensor] = []
        spans: list[tuple[int, int]] = []
        layout: list[tuple] = []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                layout.append(("constant", leaf))
                continue
            storage = leaf.untyped_storage()
            key = storage.data_ptr()
            if key in static:
                layout.append(("kept", leaf))
                continue
            if key not in index:
                index[key] = len(sources)
                sources.append(storage_bytes(storage))
                spans.append((sum(n for _, n in spans), storage.nbytes()))
            layout.append(("copied", index[key], View.of(leaf)))
        buffer = self.pool.allocate(sum(n for _, n in spans))
        with self._on(self._d2h) as stream:
            for (offset, n), source in zip(spans, sources, strict=True):
                buffer[offset : offset + n].copy_(source, non_blocking=stream is not None)
            event = _record(stream)
        copy = HostCopy(buffer, spans, treespec, layout, event)
        if event is not None:
            copies.offloading[node] = event
        if self.reloads.get(node, 0):
            copies.host[node] = copy
        else:
            self.pool.release(buffer, event)

    def reload(self, copies: StepCopies, node: Hashable) -> dict[int, object]:
        """Copy node's values back into new device memory and return them by slot, as they
        were offloaded."""
        done = copies.reloads.get(node, 0) + 1
        copies.reloads[node] = done
        last = done == self.reloads[node]
        copy = copies.host.pop(node) if last else copies.host[node]
        targets = [torch.empty(n, dtype=torch.uint8, device=self.device) for _, n in copy.spans]
        with self._on(self._h2d, copy.offloaded) as stream:
            for target, (offset, n) in zip(targets, copy.spans, strict=True):
                target.copy_(copy.buffer[offset : offset + n], non_blocking=stream is not None)
            event = _record(stream)
        copies.arriving[node] = event
        if last:
            copies.releasing[node] = copy
        leaves = [_rebuild(leaf, targets) for leaf in copy.leaves]
        return pytree.tree_unflatten(leaves, copy.treespec)

    def ready(self, copies: StepCopies, node: Hashable) -> None:
        """Make the compute stream wait for the reload that made node's device values, before
        they are read (on CPU, where a copy ends before the op that issued it returns, there is
        nothing to wait for); where it was node's last reload, release its host copy to the
        pool with the reload's event."""
        event = copies.arriving.pop(node, None)
        if event is not None:
            event.wait(torch.cuda.current_stream(self.device))
        copy = copies.releasing.pop(node, None)
        if copy is not None:
            self.pool.release(copy.buffer, event)

    def settle(self, copies: StepCopies, node: Hashable) -> None:
        """Make the compute stream wait for every copy node's device values take part in (its
        offload: the source lives until its copy ends; the reload that made them), before they
        are freed."""
        self.ready(copies, node)
        event = copies.offloading.pop(node, None)
        if event is not None:
            event.wait(torch.cuda.current_stream(self.device))

    def finish(self, copies: StepCopies) -> None:
        """The step ends when both copy engines are done: make the compute stream wait for
        every copy not yet waited for (a reloaded value live to the step's end is dropped
        there, not freed by an op)."""
        for node in [*copies.arriving, *copies.offloading]:
            self.settle(copies, node)

    @contextlib.contextmanager
    def _on(
        self, stream: torch.cuda.Stream | None, after: torch.cuda.Event | None = None
    ) -> Iterator[torch.cuda.Stream | None]:
        """Run the copies issued inside on `stream` (None: the CPU, synchronously), after the
        compute stream's work issued so far and after `after`."""
        if stream is None:
            yield None
            return
        stream.wait_stream(torch.cuda.current_stream(self.device))
        if after is not None:
            stream.wait_event(after)
        with torch.cuda.stream(stream):
            yield stream


def static_storages(values: Sequence[object]) -> set[int]:
    """Data pointers of the storages of the tensors in `values` (placeholders: not copied)."""
    return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}


def _record(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _rebuild(leaf: tuple, targets: list[torch.Tensor]) -> object:
    """A `HostCopy` leaf's value, a copied one rebuilt on its reloaded storage in `targets`."""
    if leaf[0] != "copied":
        return leaf[1]
    _, index, view = leaf
    return view.on(targets[index].untyped_storage())
