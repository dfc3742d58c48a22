"""The joint graph rewritten in a schedule's order: the graph that `emit.partition` cuts.

Each ``compute v`` copies the fx nodes of DAG node v (a recompute is a new copy, so a value
recomputed twice is two nodes), each ``free v`` drops v's copies from the environment, so a
later read can only reach a copy that the schedule keeps live. The forward slice is every op
before the first compute of a backward node; what is live there and read after it is the saved
set. Liveness in an fx graph ends at a value's last reader, never later than the schedule's
free.

A schedule's ``offload`` and ``reload`` ops become torch's ``ao.offload`` / ``ao.reload`` and
their ``ao.wait_tensor``, placed as `executor.compiled.offload` says: the forward saves a host
copy where the schedule offloads a value and reloads it in the backward. They are emitted and
checked as graphs only (structure, fake tensors): no accelerator has run them.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from executor.compiled import offload as transfer
from executor.compiled.joint_dag import END
from executor.compiled.storage import base_in
from executor.errors import CompileError
from graph_capture.measurement.measure import is_random

__all__ = ["COMPUTE", "Compute", "Rewrite", "made_by"]

Compute = tuple[Hashable, int]
"""One compute of the schedule: its DAG node and which of that node's computes (from 0)."""

COMPUTE = "remat_compute"
"""The fx node meta key naming the `Compute` an emitted node belongs to."""


_STATE = ".rng_state"


def made_by(node: torch.fx.Node) -> object:
    """The `Compute` that ``node`` belongs to, or whose value the transfer ``node`` copies
    (None for neither)."""
    return node.meta.get(COMPUTE, node.meta.get(transfer.FROM))


class Rewrite:
    """``joint`` rewritten into ``graph`` in the order of ``ops`` (module docstring; the
    arguments are `emit.partition`'s), the walk done on construction.

    ``graph``: the copies, its output node still to add; ``outputs``: the joint graph's
    outputs, each a copy in ``graph`` (the forward's as the forward slice leaves them, the
    gradients as the schedule's ``END`` finds them); ``output_computes``: the computes that made
    them; ``saved``: a forward copy the backward reads -> its joint name; ``reads``: compute ->
    the computes whose copies it reads, in the schedule's order; ``origin``: a copy -> the joint
    node it copies; ``joint_nodes``: joint name -> node."""

    def __init__(
        self,
        joint: torch.fx.GraphModule,
        ops: Sequence[tuple[str, Hashable]],
        members: dict[Hashable, list[str]],
        backward: set[Hashable],
        num_fwd_outputs: int,
        replay_rng: bool,
        inlined: Mapping[Hashable, Sequence[str]],
    ) -> None:
        self._joint = joint
        self._members = members
        self._inlined = inlined
        self.graph = torch.fx.Graph()
        self._env: dict[str, torch.fx.Node] = {}
        self._static: set[str] = set()
        self.origin: dict[torch.fx.Node, str] = {}
        for node in joint.graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                self._env[node.name] = self.graph.node_copy(node)
                self.origin[self._env[node.name]] = node.name
                if "tangents" not in str(node.target):
                    self._static.add(node.name)
        self.joint_nodes = {n.name: n for n in joint.graph.nodes}
        self.saved: dict[torch.fx.Node, str] = {}
        self._forward_side: set[str] = set()  # names whose current copy was made before the split
        self._forward_copy: dict[str, torch.fx.Node] = {}  # name -> last copy before the split
        self.reads: dict[Compute, set[Compute]] = {}
        self._computes: Counter = Counter()
        self._at_end: tuple[dict[str, torch.fx.Node], set[str]] | None = None  # END's env, side
        total = Counter(v for kind, v in ops if kind == "compute")
        self._replayed = {
            name
            for v, count in total.items()
            if count > 1 and replay_rng
            for name in members.get(v, ())
            if is_random(self.joint_nodes[name])
        }
        # the schedule's offload and reload ops (`executor.compiled.offload`)
        self._host: dict[str, torch.fx.Node] = {}  # joint name -> its host copy (offload's wait)
        self._host_side: set[str] = set()  # names whose host copy the forward made
        self._offloading: dict[Hashable, list[tuple[torch.fx.Node, torch.fx.Node, str]]] = {}
        self._arriving: dict[str, tuple[torch.fx.Node, torch.fx.Node | None]] = {}  # reload, keep
        self._retake: dict[str, tuple[tuple, object]] = {}  # a view of a reloaded storage -> tags
        self._reloads_left = Counter(v for kind, v in ops if kind == "reload")
        self._empty: set[str] = set()  # offloaded zero-element tensors, made again at reload
        self._walk(ops, backward, num_fwd_outputs)
        self.outputs, self.output_computes = self._outputs(num_fwd_outputs)

    def _walk(
        self, ops: Sequence[tuple[str, Hashable]], backward: set[Hashable], num_fwd_outputs: int
    ) -> None:
        split = _split(ops, backward)
        for i, (kind, v) in enumerate(ops):
            in_backward = i >= split
            if i == split:  # the forward ends: its copies complete in it (torch's sunk waits)
                self._finish_forward()
            if kind == "free":
                self._free(v, in_backward)
            elif kind == "offload":
                self._offload(v, i, in_backward)
            elif kind == "reload":
                self._reload(v, i, in_backward)
            elif v == END:
                self._end(num_fwd_outputs, in_backward)
            else:
                self._compute(v, in_backward)
        if split == len(ops):
            self._finish_forward()

    def _finish_forward(self) -> None:
        """The forward's pending offloads and reloads completed in it."""
        self._finish_offloads(None, False)
        for name in [*self._arriving, *self._retake]:
            self._ready(name, False)

    def _free(self, v: Hashable, in_backward: bool) -> None:
        """``v``'s copies dropped, after the waits of its pending offloads."""
        self._finish_offloads(v, in_backward)
        for name in self._members.get(v, ()):
            self._env.pop(name, None)
            self._arriving.pop(name, None)
            self._retake.pop(name, None)
            self._forward_side.discard(name)

    def _offload(self, v: Hashable, i: int, in_backward: bool) -> None:
        """An ``ao.offload`` (op ``i``) of each live tensor member of ``v`` that owns its
        storage and holds an element (a zero-element one is made again at the reload)."""
        for name in self._members.get(v, ()):
            copy = self._env.get(name)
            if copy is None or not isinstance(copy.meta.get("val"), torch.Tensor):
                continue
            if base_in(self.joint_nodes[name], self._members[v]):
                continue  # its base's copy holds its storage
            self._ready(name, in_backward)
            copy = self._env[name]
            if copy.meta["val"].numel() == 0:  # nothing to copy; made again at the reload
                self._empty.add(name)
                continue
            if in_backward and (name in self._forward_side or name in self._static):
                self.saved.setdefault(copy, name)
            off = transfer.offload_node(
                self.graph, copy, ("offload", v, i), made_by(copy), in_backward
            )
            self._offloading.setdefault(v, []).append((off, copy, name))

    def _reload(self, v: Hashable, i: int, in_backward: bool) -> None:
        """An ``ao.reload`` (op ``i``) of each host copy of ``v``'s members, an empty tensor
        for each zero-element one; their views are taken again at their first read."""
        self._reloads_left[v] -= 1
        copied = [name for name in self._members.get(v, ()) if name in self._host]
        for name in copied:
            copy = self._host[name]
            if in_backward and name in self._host_side:
                self.saved.setdefault(copy, name)
            like = self.joint_nodes[name].meta["val"]
            reload = transfer.reload_node(self.graph, copy, like, ("reload", v, i), in_backward)
            self._arriving[name] = (reload, copy if self._reloads_left[v] == 0 else None)
            self._env[name] = reload
            self.origin[reload] = name
        made = [name for name in self._members.get(v, ()) if name in self._empty]
        for name in made:
            like = self.joint_nodes[name].meta["val"]
            made_again = transfer.empty_node(self.graph, like, ("reload", v, i), in_backward)
            self._env[name] = made_again
            self.origin[made_again] = name
            if in_backward:
                self._forward_side.discard(name)
            else:
                self._forward_side.add(name)
                self._forward_copy[name] = made_again
        if not copied and not made:
            return
        source = self._host[copied[0]].meta[transfer.FROM] if copied else None
        for name in self._members.get(v, ()):
            if name in self._host or name in self._empty:
                continue
            if base_in(self.joint_nodes[name], self._members[v]):
                self._retake[name] = (("reload", v, i), source)

    def _end(self, num_fwd_outputs: int, in_backward: bool) -> None:
        """The gradients the step's end reads made ready; a reload nothing reads is left to
        dead code."""
        (output,) = self._joint.graph.find_nodes(op="output")
        for arg in list(output.args[0])[num_fwd_outputs:]:
            if isinstance(arg, torch.fx.Node):
                self._ready(arg.name, in_backward)
        self._at_end = (dict(self._env), set(self._forward_side))

    def _compute(self, v: Hashable, in_backward: bool) -> None:
        """One copy of ``v``'s fx nodes (its inlined nodes first), tagged with its `Compute`."""
        by = (v, self._computes[v])
        self._computes[v] += 1
        self.reads[by] = set()
        last = next(iter(reversed(self.graph.nodes)))
        local: dict[str, torch.fx.Node] = {}  # this compute's copies of inlined nodes
        for name in self._inlined.get(v, ()):
            node = self.joint_nodes[name]
            lookup = _local_first(local, self._read, node, in_backward, by)
            local[name] = self.graph.node_copy(node, lambda a, lookup=lookup: lookup(a.name))
            local[name].meta["partitioner_tag"] = "is_backward"
        for name in self._members.get(v, ()):
            node = self.joint_nodes[name]
            lookup = _local_first(local, self._read, node, in_backward, by)
            source = node.args[0] if node.target is operator.getitem else None
            if (
                in_backward
                and isinstance(source, torch.fx.Node)
                and _forward_tuple(self._env, self._forward_side, source)
            ):
                copy = _unpack_saved(self.graph, node, self._env[source.name], by)
                if COMPUTE in self._env[source.name].meta:
                    self.reads[by].add(self._env[source.name].meta[COMPUTE])
                self.saved[copy] = name
                self._env[name] = copy
                self.origin[copy] = name
                self._forward_side.discard(name)
                continue
            if name in self._replayed:
                fresh = name + _STATE not in self._env
                copy = _replay(self.graph, node, self._env, lookup, name + _STATE)
                if fresh and not in_backward:
                    self._forward_side.add(name + _STATE)
            else:
                copy = self.graph.node_copy(node, lambda a, lookup=lookup: lookup(a.name))
            if in_backward:
                copy.meta["partitioner_tag"] = "is_backward"
            self._env[name] = copy
            self.origin[copy] = name
            if in_backward:
                self._forward_side.discard(name)
            else:
                self._forward_side.add(name)
                self._forward_copy[name] = copy
        for added in _added(self.graph, last):
            if transfer.TRANSFER not in added.meta:
                added.meta[COMPUTE] = by

    def _outputs(self, num_fwd_outputs: int) -> tuple[list, set[Compute]]:
        """The joint graph's outputs as copies (a gradient the forward made saved) and the
        computes that made them."""
        live_at_end, side_at_end = (
            self._at_end if self._at_end is not None else (self._env, self._forward_side)
        )
        (output,) = self._joint.graph.find_nodes(op="output")
        flat = list(output.args[0])
        live: set[Compute] = set()
        for position, arg in enumerate(flat):
            if not isinstance(arg, torch.fx.Node):
                continue
            if position < num_fwd_outputs:  # returned by the forward
                copy = self._forward_copy.get(arg.name, self._env.get(arg.name))
            else:  # a gradient: the copy live at END, saved where the forward made it
                copy = live_at_end.get(arg.name)
                if arg.name in side_at_end | self._static and copy is not None:
                    self.saved.setdefault(copy, arg.name)
            if copy is None:
                raise CompileError(
                    f"the schedule leaves the graph output '{arg.name}' not live at its end; "
                    "this is a defect in remat: report it with the model"
                )
            flat[position] = copy
            if made_by(copy) is not None:
                live.add(made_by(copy))
        return flat, live

    def _finish_offloads(self, v: Hashable | None, in_backward: bool) -> None:
        """The waits of ``v``'s pending offloads (all pending ones for None)."""
        for u in [v] if v is not None else list(self._offloading):
            for off, source, name in self._offloading.pop(u, ()):
                wait = transfer.wait_node(self.graph, off, in_backward, last_use=source)
                self._host[name] = wait
                if not in_backward:
                    self._host_side.add(name)

    def _ready(self, name: str, in_backward: bool) -> None:
        """Wait for ``name``'s reload, or take its view again, where it is still to come."""
        if name in self._arriving:
            reload, keep = self._arriving.pop(name)
            self._env[name] = transfer.wait_node(self.graph, reload, in_backward, keepalive=keep)
            self.origin[self._env[name]] = name
        elif name in self._retake:  # taken again from its reloaded base at its first read
            what, source = self._retake.pop(name)
            node = self.joint_nodes[name]
            copy = self.graph.node_copy(node, lambda a: self._taken(a.name, in_backward))
            copy.meta[transfer.TRANSFER] = what
            copy.meta[transfer.FROM] = source
            if in_backward:
                copy.meta["partitioner_tag"] = "is_backward"
            self._env[name] = copy
            self.origin[copy] = name
        else:
            return
        if in_backward:
            self._forward_side.discard(name)
        else:
            self._forward_side.add(name)
            self._forward_copy[name] = self._env[name]

    def _taken(self, name: str, in_backward: bool) -> torch.fx.Node:
        self._ready(name, in_backward)
        return self._env[name]

    def _read(
        self, name: str, reader: torch.fx.Node, in_backward: bool, by: Compute
    ) -> torch.fx.Node:
        if name not in self._env and name not in self._retake:
            raise CompileError(
                f"the schedule computes '{reader.name}' when its input '{name}' is not live; "
                "this is a defect in remat: report it with the model"
            )
        self._ready(name, in_backward)
        if in_backward and (name in self._forward_side or name in self._static):
            self.saved.setdefault(self._env[name], name)
        if made_by(self._env[name]) is not None:
            self.reads[by].add(made_by(self._env[name]))
        return self._env[name]


def _replay(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    env: dict[str, torch.fx.Node],
    read: Callable[[str], torch.fx.Node],
    state_name: str,
) -> torch.fx.Node:
    """A copy of random ``node`` whose draw replays: the first records the generator state
    (``env[state_name]``), later ones run from it."""
    args, kwargs = torch.fx.map_arg((node.args, node.kwargs), lambda a: read(a.name))
    if state_name not in env:
        pair = graph.call_function(run_and_save_rng_state, (node.target, *args), kwargs)
        state = graph.call_function(operator.getitem, (pair, 0))
        copy = graph.call_function(operator.getitem, (pair, 1))
        val = node.meta["val"]
        fake = next(t for t in pytree.tree_leaves(val) if isinstance(t, torch.Tensor))
        size = torch.get_rng_state().numel()
        with fake.fake_mode:
            state.meta["val"] = torch.empty(size, dtype=torch.uint8, device=fake.device)
        pair.meta["val"] = (state.meta["val"], val)
        env[state_name] = state
    else:
        copy = graph.call_function(
            run_with_rng_state, (read(state_name), node.target, *args), kwargs
        )
    copy.meta = dict(node.meta)
    return copy


def _unpack_saved(
    graph: torch.fx.Graph, node: torch.fx.Node, source: torch.fx.Node, by: Compute
) -> torch.fx.Node:
    """``node`` (a ``getitem`` of a multi-output op) as a new getitem of the forward's copy
    ``source`` of that op, placed right after it in the forward: the backward then reads a
    saved tensor (an alias of the op's output), never the op's tuple."""
    with graph.inserting_after(source):
        item = graph.call_function(operator.getitem, (source, *node.args[1:]))
    item.meta = {**node.meta, COMPUTE: by}
    return item


def _forward_tuple(
    env: dict[str, torch.fx.Node], forward_side: set[str], source: torch.fx.Node
) -> bool:
    """True where the current copy of ``source`` was made by the forward and holds several
    values (a multi-output op's result)."""
    return source.name in forward_side and isinstance(
        env[source.name].meta.get("val"), tuple | list
    )


def _local_first(
    local: dict[str, torch.fx.Node],
    read: Callable[..., torch.fx.Node],
    reader: torch.fx.Node,
    in_backward: bool,
    by: Compute,
) -> Callable[[str], torch.fx.Node]:
    """A name's copy for ``reader``: this compute's own copy of an inlined node, else the
    environment's (``read``)."""

    def lookup(name: str) -> torch.fx.Node:
        if name in local:
            return local[name]
        return read(name, reader=reader, in_backward=in_backward, by=by)

    return lookup


def _split(ops: Sequence[tuple[str, Hashable]], backward: set[Hashable]) -> int:
    """Index of the first compute of a backward DAG node (len(ops) if none)."""
    for i, (kind, v) in enumerate(ops):
        if kind == "compute" and v in backward:
            return i
    return len(ops)


def _added(graph: torch.fx.Graph, after: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes of ``graph`` after ``after`` (those a step appended)."""
    found, node = [], after.next
    while node.op != "root":
        found.append(node)
        node = node.next
    return found
