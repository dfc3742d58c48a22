"""A schedule's offload and reload ops as torch's activation-offloading ops.

torch's ops (``torch/_functorch/_activation_offloading/offload_ops.py``) are the ones its own
pass (``activation_offloading.py``, ``offload_chosen_sets_async``) emits and inductor lowers:

- ``host = ao.offload(x)``: a device-to-host copy of ``x`` into pinned host memory, issued on a
  transfer stream; ``host = ao.wait_tensor(host, keepalive=x)`` makes the compute stream wait
  for it and then frees ``x``'s storage (``resize_(0)``);
- ``x = ao.reload(host, device, size, stride)``: the host-to-device copy back into a tensor of
  the original size and stride; ``x = ao.wait_tensor(x, keepalive=host)`` waits for it and
  then frees the host buffer.

How `emit.partition` places them (remat's schedule decides, not torch's heuristics):

- ``("offload", v)``: one ``ao.offload`` per tensor member of DAG node v that owns its storage
  (its views share it: they are taken again from the reloaded base), at the op's position.
  Its ``ao.wait_tensor`` (keepalive the source) goes where the schedule frees v's device copy:
  the schedule's timeline makes that free wait for the copy (docs/offload.md). Where the
  device copy is still live when the forward ends, the wait closes the forward, as torch's
  ``activation_offload_sink_wait_async`` places it. The keepalive is dropped where a tensor of
  the source's storage is still read after the wait, saved or returned, or the storage is a
  graph input's: ``resize_(0)`` would free a storage still in use.
- A host copy made by the forward and reloaded by the backward is what the forward saves: the
  offload's wait node, a host tensor, as torch's pass saves it; no device copy of v is saved
  unless the schedule itself keeps one across the split.
- ``("reload", v)``: one ``ao.reload`` per host copy at the op's position (the schedule's
  prefetch); its ``ao.wait_tensor`` goes right before the first node that reads the reloaded
  tensor (a view of it taken again counts). Only the last reload of a host copy passes it as
  keepalive (frees it): the schedule may reload one host copy more than once. A reload whose
  tensor nothing reads (one the schedule makes for the step's end, of a forward output the
  forward returns itself) gets no wait and is left to dead-code elimination.
- Each transfer node is tagged ``must_be_in_forward`` / ``must_be_in_backward``: the
  ``ao.wait_tensor`` has a side effect, so dead-code elimination never drops it, and without
  the tag torch's cut (``_extract_fwd_bwd_modules``) would copy a transfer whose inputs both
  graphs hold into both.

Nothing here runs the ops: they need an accelerator (pinned memory, a transfer stream; on a
CPU-only build ``ao.offload`` raises "Accelerator expected"). Their fake kernels give the
emitted nodes' ``meta["val"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import torch

import solver
from executor.compiled.storage import view_root

__all__ = [
    "FROM",
    "TRANSFER",
    "keep_alive_where_read",
    "offload_node",
    "ops",
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
    keepalive: torch.fx.Node | None,
    backward: bool,
) -> torch.fx.Node:
    """``ao.wait_tensor(transfer, keepalive)`` appended to ``graph``; tagged as ``transfer``."""
    node = graph.call_function(
        ops().wait_tensor.default, (transfer,) if keepalive is None else (transfer, keepalive)
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


def keep_alive_where_read(
    graph: torch.fx.Graph,
    waits: list[tuple[torch.fx.Node, torch.fx.Node]],
    escaping: set[torch.fx.Node],
) -> None:
    """Drop an offload wait's keepalive (which frees the source's storage) where a tensor of
    that storage is read after the wait, saved or returned (``escaping``), or the storage is
    a graph input's (a view of a parameter); ``waits``: (offload wait, its source)."""
    position = {n: k for k, n in enumerate(graph.nodes)}
    sharing: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        sharing.setdefault(view_root(node), []).append(node)
    for wait, source in waits:
        if wait not in position or len(wait.args) < 2:
            continue
        root = view_root(source)
        aliases = sharing.get(root, [source])
        if root.op != "call_function" or any(
            a in escaping or any(position[u] > position[wait] for u in a.users if u is not wait)
            for a in aliases
        ):
            wait.args = wait.args[:1]
