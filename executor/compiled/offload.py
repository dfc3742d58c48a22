"""A schedule's offload and reload ops as torch's activation-offloading ops.

torch's ops (``torch/_functorch/_activation_offloading/offload_ops.py``) are the ones its own
pass (``activation_offloading.py``, ``offload_chosen_sets_async``) emits and inductor lowers:

- ``host = ao.offload(x)``: a device-to-host copy of ``x`` into pinned host memory, issued on
  the device's one transfer stream (both directions share it, in issue order), which first
  waits for the compute stream; the copy's completion event is registered under the host
  tensor's ``data_ptr``;
- ``x = ao.reload(host, device, size, stride)``: a device tensor of the original size and stride,
  allocated on the compute stream, filled by a host-to-device copy on the same transfer stream;
  its event registered under the device tensor's ``data_ptr``;
- ``y = ao.wait_tensor(y, keepalive=k, last_use_of_storage=s)``: the compute stream waits for the
  event registered under ``y``'s ``data_ptr``; then ``k``'s storage is freed (``resize_(0)``, or a
  pinned buffer the pool lent goes back to it). ``k`` and ``s`` are read by the op, so the graph
  holds them at least until the wait.

How `emit.partition` places them (remat's schedule decides, not torch's heuristics):

- ``("offload", v)``: one ``ao.offload`` per tensor member of DAG node v that owns its storage
  and holds at least one element (its views share it: they are taken again from the reloaded
  base), at the op's position. A zero-element tensor is never copied: its ``data_ptr`` is 0,
  so two of them would collide in torch's wait registry (keyed by ``data_ptr``); the reload
  makes it again as an empty tensor of its size and stride (it holds no bytes to copy).
- Its ``ao.wait_tensor`` goes where the schedule frees v's device copy: the schedule's timeline
  makes that free wait for the copy (docs/offload.md). Where the device copy is still live when
  the forward ends, the wait closes the forward, as torch's
  ``activation_offload_sink_wait_async`` places it. The source is the wait's
  ``last_use_of_storage``, never its ``keepalive``: the graph itself (inductor's buffer
  planning, or the fx code's ``del``) frees the source after its last reader, which the wait is
  among, so no order a scheduler picks frees it while the copy reads it, and no buffer the
  wait freed behind the scheduler's back is read or reused (inductor's wrapper for a graph
  with ``keepalive=x``, generated on this machine, ran a reader of ``x`` after the wait and
  reused ``x``'s buffer for a later kernel; docs/compile.md).
- A host copy made by the forward and reloaded by the backward is what the forward saves: the
  offload's wait node, a host tensor, as torch's pass saves it; no device copy of v is saved
  unless the schedule itself keeps one across the split.
- ``("reload", v)``: one ``ao.reload`` per host copy at the op's position (the schedule's
  prefetch); its ``ao.wait_tensor`` goes right before the first node that reads the reloaded
  tensor (a view of it taken again counts). Only the last reload of a host copy passes it as
  keepalive, which hands the pinned buffer back (to torch's pool, `PinnedPool`): the schedule
  may reload one host copy more than once. A reload whose tensor nothing reads (one the
  schedule makes for the step's end, of a forward output the forward returns itself) gets no
  wait and is left to dead-code elimination.
- Each transfer node is tagged ``must_be_in_forward`` / ``must_be_in_backward``: the
  ``ao.wait_tensor`` has a side effect, so dead-code elimination never drops it, and without
  the tag torch's cut (``_extract_fwd_bwd_modules``) would copy a transfer whose inputs both
  graphs hold into both.
- `pin_order`, on each cut graph: every transfer node runs after the compute the schedule puts
  before it, and the wait that hands a host copy back after every reload of that copy, through
  torch's ``control_deps`` (the ordering edges inductor's scheduler and its peak-memory
  reordering keep). Without them inductor moved a reload's wait up to the reload, making the
  compute stream wait for the whole copy where the schedule overlaps it. Not pinned: a
  transfer running *before* the compute the schedule puts after it (``control_deps`` orders a
  node after others, and a compute inductor fuses into its reader creates no operation to
  order); the measured peak and seconds show where inductor departs.

Nothing here runs the ops: they need an accelerator (pinned memory, a transfer stream; on a
CPU-only build ``ao.offload`` raises "Accelerator expected"). Their fake kernels give the
emitted nodes' ``meta["val"]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Hashable

import torch

import solver

__all__ = [
    "FROM",
    "TRANSFER",
    "PinnedPool",
    "empty_node",
    "offload_node",
    "ops",
    "pin_order",
    "reload_node",
    "transfer_link",
    "wait_node",
]


def transfer_link(link: solver.Link) -> solver.Link:
    """The link the ops copy over: ``link`` with one engine for both directions
    (``duplex=False``). ``ao.offload`` and ``ao.reload`` issue every copy on one transfer stream
    per device (``_get_or_create_transfer_stream``), so a copy queues behind every copy issued
    before it, in either direction; the schedules are solved over this link."""
    return dataclasses.replace(link, duplex=False)


TRANSFER = "remat_transfer"
"""The fx node meta key of the nodes a schedule's offload or reload op emits: (kind, DAG node,
index of the op in the schedule)."""

FROM = "remat_from"
"""The fx node meta key naming the `rewrite.Compute` whose value a transfer node copies."""


def ops():
    """torch's ``ao`` op namespace, its ops registered (importing torch's module does it)."""
    import torch._functorch._activation_offloading.offload_ops

    return torch.ops.ao


def _fake(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


def _run_fake(op: torch._ops.OpOverload, *args: object) -> torch.Tensor:
    """``op``'s fake kernel on fake arguments: the emitted node's ``meta["val"]``."""
    mode = next(a.fake_mode for a in args if hasattr(a, "fake_mode"))
    with mode:
        return op(*args)


def _tag(node: torch.fx.Node, what: tuple[str, Hashable, int], source: object, backward: bool):
    node.meta[TRANSFER] = what
    node.meta[FROM] = source
    node.meta["partitioner_tag"] = "must_be_in_backward" if backward else "must_be_in_forward"


def offload_node(
    graph: torch.fx.Graph,
    source: torch.fx.Node,
    what: tuple[str, Hashable, int],
    made_by: object,
    backward: bool,
) -> torch.fx.Node:
    """``ao.offload(source)`` appended to ``graph``; ``made_by``: the compute that made
    ``source`` (None for a graph input)."""
    op = ops().offload.default
    node = graph.call_function(op, (source,))
    node.meta["val"] = _run_fake(op, _fake(source))
    _tag(node, what, made_by, backward)
    return node


def wait_node(
    graph: torch.fx.Graph,
    transfer: torch.fx.Node,
    backward: bool,
    *,
    keepalive: torch.fx.Node | None = None,
    last_use: torch.fx.Node | None = None,
) -> torch.fx.Node:
    """``ao.wait_tensor(transfer, keepalive=, last_use_of_storage=last_use)`` appended to
    ``graph`` (each left out where None); tagged as ``transfer``."""
    kwargs = {"keepalive": keepalive, "last_use_of_storage": last_use}
    node = graph.call_function(
        ops().wait_tensor.default,
        (transfer,),
        {k: v for k, v in kwargs.items() if v is not None},
    )
    node.meta["val"] = transfer.meta["val"]
    _tag(node, transfer.meta[TRANSFER], transfer.meta[FROM], backward)
    return node


def reload_node(
    graph: torch.fx.Graph,
    host: torch.fx.Node,
    like: torch.Tensor,
    what: tuple[str, Hashable, int],
    backward: bool,
) -> torch.fx.Node:
    """``ao.reload(host, device, size, stride)`` appended to ``graph``: the device tensor of
    ``like``'s device, size and stride (the offloaded value's)."""
    op = ops().reload.default
    size, stride = list(like.size()), list(like.stride())
    node = graph.call_function(op, (host, like.device, size, stride))
    node.meta["val"] = _run_fake(op, _fake(host), like.device, size, stride)
    _tag(node, what, host.meta[FROM], backward)
    return node


def empty_node(
    graph: torch.fx.Graph,
    like: torch.Tensor,
    what: tuple[str, Hashable, int],
    backward: bool,
) -> torch.fx.Node:
    """``aten.empty_strided`` of ``like``'s size, stride, dtype and device appended to
    ``graph``: a zero-element tensor made again at its reload (it holds no bytes to copy, and
    reads no compute)."""
    op = torch.ops.aten.empty_strided.default
    size, stride = list(like.size()), list(like.stride())
    kwargs = {"dtype": like.dtype, "device": like.device}
    node = graph.call_function(op, (size, stride), kwargs)
    with like.fake_mode:
        node.meta["val"] = op(size, stride, **kwargs)
    _tag(node, what, None, backward)
    return node


def pin_order(module: torch.fx.GraphModule) -> None:
    """Order each transfer node of ``module`` (``ao.offload``, ``ao.reload``,
    ``ao.wait_tensor``) after the compute before it in the graph, and a wait that hands a host
    copy back (its ``keepalive``) after every reload of that copy, with torch's
    ``control_deps`` (module docstring); a graph without transfers is left as it is."""
    if not any(TRANSFER in node.meta for node in module.graph.nodes):
        return  # nothing to pin, and torch's offload ops need not exist
    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    ao = ops()
    transfers = {ao.offload.default, ao.reload.default, ao.wait_tensor.default}
    after: dict[torch.fx.Node, OrderedSet] = {}
    reloads: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # host copy -> its reloads so far
    compute = None  # the last compute seen
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target not in transfers:
            compute = node
            continue
        deps = OrderedSet([compute] if compute is not None else [])
        if node.target is ao.reload.default:
            reloads.setdefault(node.args[0], []).append(node)
        host = node.kwargs.get("keepalive")
        if host is not None:
            deps.update(r for r in reloads.get(host, ()) if r is not node.args[0])
        if deps:
            after[node] = deps
    if after:
        preserve_node_ordering(module.graph, after)
        module.recompile()


class PinnedPool:
    """torch's pinned host-memory pool for its offload ops (``pinned_memory_pool``), held open
    from `open` to `close`: while it is open, each ``ao.offload`` takes a pinned buffer of its
    element count and dtype from the pool (allocating one where none is free), and the wait of
    the host copy's last reload hands it back, so each step reuses the buffers of the step
    before instead of pinning new memory per copy. The pool is torch's, one per process:
    ``host_idle()`` counts every buffer it holds free (all of them between steps), in requested
    bytes (element count times element size; torch's host allocator may round the
    allocation up)."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None

    def open(self) -> None:
        """Enable the pool (no-op where this object already holds it open)."""
        if self._stack is None:
            import torch._functorch._activation_offloading.offload_ops as offload_ops

            stack = contextlib.ExitStack()
            stack.enter_context(offload_ops.pinned_memory_pool())
            self._stack = stack

    def close(self) -> None:
        """Leave the pool: torch frees its buffers unless an outer pool holds them."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @property
    def is_open(self) -> bool:
        return self._stack is not None

    @staticmethod
    def host_idle() -> int:
        """The host bytes of the pinned buffers torch's pool holds free (requested bytes)."""
        import torch._functorch._activation_offloading.offload_ops as offload_ops

        pool = getattr(offload_ops, "_pinned_pool", {})
        return sum(b.numel() * b.element_size() for bucket in pool.values() for b in bucket)
