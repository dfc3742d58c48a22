"""A schedule as the forward and backward graphs of a compiled step.

The joint graph is rewritten in the schedule's order: each ``compute v`` copies the fx nodes of
DAG node v (a recompute is a new copy, so a value recomputed twice is two nodes), each
``free v`` drops v's copies from the environment, so a later read can only reach a copy that
the schedule keeps live. The forward slice is every op before the first compute of a backward
node; what is live there and read after it is the saved set. torch's own
``_extract_fwd_bwd_modules`` then cuts the rewritten joint graph at that saved set, so the
graphs keep AOTAutograd's calling convention (saved values, then tangents). Liveness in an fx
graph ends at a value's last reader, never later than the schedule's free.

The graph's outputs are the forward's outputs as the forward slice leaves them (its last copy
before the split) and the gradients as the schedule's ``END`` finds them (the copy live then).
A compute whose copies nothing live reads, neither a later compute nor an output, is dead
unless it has an effect (the first compute of a node that draws random numbers or mutates): it
is left out of the graphs and listed (`Partition.dead`); every other compute of the schedule
is one copy of its DAG node's fx nodes in the forward or the backward graph.

A schedule's ``offload`` and ``reload`` ops become torch's ``ao.offload`` / ``ao.reload`` and
their ``ao.wait_tensor``, placed as `executor.compiled.offload` says: the forward saves a host
copy where the schedule offloads a value and reloads it in the backward. They are emitted and
checked as graphs only (structure, fake tensors): no accelerator has run them.

NOTE [one saved tensor per storage]: AOTAutograd donates to the backward every saved tensor
that aliases no graph input or output (``torch._functorch.config.donated_buffer``), and inductor
reuses a donated buffer once that tensor's own last reader has run. Two saved tensors of one
storage (a view and its base, two views of one split) would let a kernel overwrite the storage
that the other still views: silently wrong gradients. The forward therefore saves one tensor per
storage, the root of its view chain (`_view_root`), and the backward takes its views again
from it (view ops allocate nothing).
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch._functorch.partitioners import _extract_fwd_bwd_modules
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from executor.compiled import offload as transfer
from executor.compiled.joint_dag import END, runs_once
from executor.errors import CompileError
from graph_capture.measurement.measure import is_random

__all__ = ["COMPUTE", "Compute", "Partition", "partition"]


@dataclass
class Partition:
    """``forward``, ``backward``: the graph modules; ``saved``: joint fx node names the forward
    saves for the backward (parameters and inputs included); ``recomputes``: DAG node ->
    how many times the graphs compute it beyond its first (forward recomputes counted too,
    dead computes not); ``dead``: the schedule's computes left out as dead, each as (DAG node,
    which of its computes, from 0), in the schedule's order; ``offloaded``: joint fx node
    names whose host copy (`executor.compiled.offload`) the forward saves, never in
    ``saved`` unless the schedule also keeps a device copy across the split."""

    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    saved: list[str]
    recomputes: dict[Hashable, int]
    dead: list[tuple[Hashable, int]]
    offloaded: list[str] = dataclasses.field(default_factory=list)


Compute = tuple[Hashable, int]
"""One compute of the schedule: its DAG node and which of that node's computes (from 0)."""

COMPUTE = "remat_compute"
"""The fx node meta key naming the `Compute` an emitted node belongs to."""


_STATE = ".rng_state"

_ALIASING = {torch.ops.aten._unsafe_view.default}
"""Ops whose output shares its input's storage though their schema declares no alias."""


def _view_base(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node whose storage ``node``'s output views: the input of a view op (or of an op in
    `_ALIASING`), or for a ``getitem`` of a view op's list (``split``) that op's input; None
    where ``node`` creates its own storage."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    target, base = node.target, node.args[0]
    if target is operator.getitem:
        source = base.target
        if isinstance(source, torch._ops.OpOverload) and source.is_view:
            return base.args[0] if isinstance(base.args[0], torch.fx.Node) else None
        return None
    if isinstance(target, torch._ops.OpOverload) and (target.is_view or target in _ALIASING):
        return base
    return None


def _view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The first node of ``node``'s view chain: the one that created the storage it views."""
    while (base := _view_base(node)) is not None:
        node = base
    return node


def _one_per_storage(
    saved: dict[torch.fx.Node, str], origin: Mapping[torch.fx.Node, str]
) -> dict[torch.fx.Node, str]:
    """``saved`` (forward copy -> joint name) with every group of copies that share a view
    root replaced by that root (NOTE [one saved tensor per storage]); ``origin`` names each
    copy's joint node. A copy alone on its storage stays as it is."""
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for copy in saved:
        groups.setdefault(_view_root(copy), []).append(copy)
    kept: dict[torch.fx.Node, str] = {}
    for root, copies in groups.items():
        if len(copies) == 1:
            kept[copies[0]] = saved[copies[0]]
        else:
            kept[root] = saved.get(root, origin[root])
    return kept


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


def partition(
    joint: torch.fx.GraphModule,
    ops: Sequence[tuple[str, Hashable]],
    members: dict[Hashable, list[str]],
    backward: set[Hashable],
    num_fwd_outputs: int,
    replay_rng: bool,
    inlined: Mapping[Hashable, Sequence[str]] | None = None,
) -> Partition:
    """Forward and backward graph modules realising ``ops`` (a checked schedule of the DAG
    whose node -> fx members map is ``members``; ``backward`` its backward nodes), its dead
    computes left out (module docstring).

    ``replay_rng``: a random op the schedule computes more than once runs first under
    ``run_and_save_rng_state`` (the generator's state before its draw becomes a value of the
    graph, saved for the backward where a recompute is there) and each recompute under
    ``run_with_rng_state`` from that state, so it draws the same numbers and leaves the
    generator as it was. Without it the caller must not schedule such a recompute.

    ``inlined``: DAG node -> fx nodes of other DAG nodes that each of its computes copies
    first, for its own ops alone (`joint_dag.inline_reads`): its ops read those copies, and
    freeing it or another node leaves them untouched."""
    inlined = inlined or {}
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    static: set[str] = set()
    origin: dict[torch.fx.Node, str] = {}  # a copy -> the joint node it copies
    for node in joint.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            env[node.name] = graph.node_copy(node)
            origin[env[node.name]] = node.name
            if "tangents" not in str(node.target):
                static.add(node.name)
    joint_nodes = {n.name: n for n in joint.graph.nodes}
    split = _split(ops, backward)
    saved: dict[torch.fx.Node, str] = {}  # a forward copy the backward reads -> its joint name
    forward_side: set[str] = set()  # names whose current copy was made before the split
    forward_copy: dict[str, torch.fx.Node] = {}  # joint name -> its last copy before the split
    reads: dict[Compute, set[Compute]] = {}  # compute -> the computes whose copies it reads
    computes: Counter = Counter()
    end: tuple[dict[str, torch.fx.Node], set[str]] | None = None  # env, forward_side at END
    total = Counter(v for kind, v in ops if kind == "compute")
    replayed = {
        name
        for v, count in total.items()
        if count > 1 and replay_rng
        for name in members.get(v, ())
        if is_random(joint_nodes[name])
    }
    # the schedule's offload and reload ops (`executor.compiled.offload`)
    host: dict[str, torch.fx.Node] = {}  # joint name -> its host copy (an offload's wait)
    host_side: set[str] = set()  # names whose host copy the forward made
    offloading: dict[Hashable, list[tuple[torch.fx.Node, torch.fx.Node, str]]] = {}
    arriving: dict[str, tuple[torch.fx.Node, torch.fx.Node | None]] = {}  # reload, keepalive
    retake: dict[str, tuple[tuple, object]] = {}  # a view of a reloaded storage -> its tags
    reloads_left = Counter(v for kind, v in ops if kind == "reload")
    offload_waits: list[tuple[torch.fx.Node, torch.fx.Node]] = []  # (wait, source)

    def made_by(node: torch.fx.Node) -> object:
        return node.meta.get(COMPUTE, node.meta.get(transfer.FROM))

    def finish_offloads(v: Hashable | None, in_backward: bool) -> None:
        """The waits of ``v``'s pending offloads (all pending ones for None)."""
        for u in [v] if v is not None else list(offloading):
            for off, source, name in offloading.pop(u, ()):
                wait = transfer.wait_node(graph, off, source, in_backward)
                host[name] = wait
                offload_waits.append((wait, source))
                if not in_backward:
                    host_side.add(name)

    def ready(name: str, in_backward: bool) -> None:
        """Wait for ``name``'s reload, or take its view again, where it is still to come."""
        if name in arriving:
            reload, keep = arriving.pop(name)
            env[name] = transfer.wait_node(graph, reload, keep, in_backward)
            origin[env[name]] = name
        elif name in retake:  # taken again from its reloaded base at its first read
            what, source = retake.pop(name)
            node = joint_nodes[name]
            copy = graph.node_copy(node, lambda a: taken(a.name, in_backward))
            copy.meta[transfer.TRANSFER] = what
            copy.meta[transfer.FROM] = source
            if in_backward:
                copy.meta["partitioner_tag"] = "is_backward"
            env[name] = copy
            origin[copy] = name
        else:
            return
        if in_backward:
            forward_side.discard(name)
        else:
            forward_side.add(name)
            forward_copy[name] = env[name]

    def taken(name: str, in_backward: bool) -> torch.fx.Node:
        ready(name, in_backward)
        return env[name]

    def finish_reloads(in_backward: bool) -> None:
        for name in [*arriving, *retake]:
            ready(name, in_backward)

    def read(name: str, reader: torch.fx.Node, in_backward: bool, by: Compute) -> torch.fx.Node:
        if name not in env and name not in retake:
            raise CompileError(
                f"the schedule computes '{reader.name}' when its input '{name}' is not live; "
                "this is a defect in remat: report it with the model"
            )
        ready(name, in_backward)
        if in_backward and (name in forward_side or name in static):
            saved.setdefault(env[name], name)
        if made_by(env[name]) is not None:
            reads[by].add(made_by(env[name]))
        return env[name]

    for i, (kind, v) in enumerate(ops):
        in_backward = i >= split
        if i == split:  # the forward ends: its copies complete in it (torch's sunk waits)
            finish_offloads(None, False)
            finish_reloads(False)
        if kind == "free":
            finish_offloads(v, in_backward)
            for name in members.get(v, ()):
                env.pop(name, None)
                arriving.pop(name, None)
                retake.pop(name, None)
                forward_side.discard(name)
            continue
        if kind == "offload":
            for name in members.get(v, ()):
                copy = env.get(name)
                if copy is None or not isinstance(copy.meta.get("val"), torch.Tensor):
                    continue
                if _base_in(joint_nodes[name], members[v]):
                    continue  # its base's copy holds its storage
                ready(name, in_backward)
                copy = env[name]
                if in_backward and (name in forward_side or name in static):
                    saved.setdefault(copy, name)
                off = transfer.offload_node(
                    graph, copy, ("offload", v, i), made_by(copy), in_backward
                )
                offloading.setdefault(v, []).append((off, copy, name))
            continue
        if kind == "reload":
            reloads_left[v] -= 1
            copied = [name for name in members.get(v, ()) if name in host]
            for name in copied:
                copy = host[name]
                if in_backward and name in host_side:
                    saved.setdefault(copy, name)
                like = joint_nodes[name].meta["val"]
                reload = transfer.reload_node(graph, copy, like, ("reload", v, i), in_backward)
                arriving[name] = (reload, copy if reloads_left[v] == 0 else None)
                env[name] = reload
                origin[reload] = name
            for name in members.get(v, ()) if copied else ():
                if name not in host and _base_in(joint_nodes[name], members[v]):
                    retake[name] = (("reload", v, i), host[copied[0]].meta[transfer.FROM])
            continue
        if v == END:  # the gradients it reads; a reload nothing reads is left to dead code
            (output,) = joint.graph.find_nodes(op="output")
            for arg in list(output.args[0])[num_fwd_outputs:]:
                if isinstance(arg, torch.fx.Node):
                    ready(arg.name, in_backward)
            end = (dict(env), set(forward_side))
            continue
        by = (v, computes[v])
        computes[v] += 1
        reads[by] = set()
        last = next(iter(reversed(graph.nodes)))
        local: dict[str, torch.fx.Node] = {}  # this compute's copies of inlined nodes
        for name in inlined.get(v, ()):
            node = joint_nodes[name]
            lookup = _local_first(local, read, node, in_backward, by)
            local[name] = graph.node_copy(node, lambda a, lookup=lookup: lookup(a.name))
            local[name].meta["partitioner_tag"] = "is_backward"
        for name in members.get(v, ()):
            node = joint_nodes[name]
            lookup = _local_first(local, read, node, in_backward, by)
            source = node.args[0] if node.target is operator.getitem else None
            if (
                in_backward
                and isinstance(source, torch.fx.Node)
                and _forward_tuple(env, forward_side, source)
            ):
                copy = _unpack_saved(graph, node, env[source.name], by)
                if COMPUTE in env[source.name].meta:
                    reads[by].add(env[source.name].meta[COMPUTE])
                saved[copy] = name
                env[name] = copy
                origin[copy] = name
                forward_side.discard(name)
                continue
            if name in replayed:
                fresh = name + _STATE not in env
                copy = _replay(graph, node, env, lookup, name + _STATE)
                if fresh and not in_backward:
                    forward_side.add(name + _STATE)
            else:
                copy = graph.node_copy(node, lambda a, lookup=lookup: lookup(a.name))
            if in_backward:
                copy.meta["partitioner_tag"] = "is_backward"
            env[name] = copy
            origin[copy] = name
            if in_backward:
                forward_side.discard(name)
            else:
                forward_side.add(name)
                forward_copy[name] = copy
        for added in _added(graph, last):
            if transfer.TRANSFER not in added.meta:
                added.meta[COMPUTE] = by
    if split == len(ops):
        finish_offloads(None, False)
        finish_reloads(False)
    live_at_end, side_at_end = end if end is not None else (env, forward_side)
    (output,) = joint.graph.find_nodes(op="output")
    flat = list(output.args[0])
    live: set[Compute] = set()
    for position, arg in enumerate(flat):
        if not isinstance(arg, torch.fx.Node):
            continue
        if position < num_fwd_outputs:  # returned by the forward
            copy = forward_copy.get(arg.name, env.get(arg.name))
        else:  # a gradient: the copy live at END, saved where the forward made it
            copy = live_at_end.get(arg.name)
            if arg.name in side_at_end | static and copy is not None:
                saved.setdefault(copy, arg.name)
        if copy is None:
            raise CompileError(
                f"the schedule leaves the graph output '{arg.name}' not live at its end; this "
                "is a defect in remat: report it with the model"
            )
        flat[position] = copy
        if made_by(copy) is not None:
            live.add(made_by(copy))
    order = list(reads)
    live |= {(v, 0) for v, k in order if any(runs_once(joint_nodes[m]) for m in members[v])}
    for by in reversed(order):
        if by in live:
            live |= reads[by]
    dead = [by for by in order if by not in live]
    gone = set(dead)
    for node in reversed(graph.nodes):
        if node.meta.get(COMPUTE) in gone or node.meta.get(transfer.FROM) in gone:
            graph.erase_node(node)
    saved = {copy: name for copy, name in saved.items() if made_by(copy) not in gone}
    saved = _one_per_storage(saved, origin)
    for copy in saved:
        if not isinstance(copy.meta.get("val"), torch.Tensor):
            raise CompileError(
                f"the forward would save '{copy.name}', a {type(copy.meta.get('val')).__name__}"
                " and not a tensor; this is a defect in remat: report it with the model"
            )
    _keep_alive_where_read(graph, offload_waits, set(saved) | set(flat))
    graph.output(type(output.args[0])(flat) if isinstance(output.args[0], tuple) else flat)
    graph.output_node().meta = dict(output.meta)
    rewritten = torch.fx.GraphModule(joint, graph)
    forward, backward_module = _extract_fwd_bwd_modules(
        rewritten, list(saved), [], num_fwd_outputs=num_fwd_outputs
    )
    _drop_unread_draws(backward_module)
    emitted = {n.meta.get(COMPUTE) for m in (forward, backward_module) for n in m.graph.nodes}
    missing = [by for by in live if members.get(by[0]) and by not in emitted]
    if missing:
        raise CompileError(
            f"the graphs lost the schedule's compute {missing[0]} that a live value needs; "
            "this is a defect in remat: report it with the model"
        )
    joint_name = {copy.name: name for copy, name in saved.items()}
    hosts = {copy.name for copy in saved if transfer.TRANSFER in copy.meta}
    inputs = [
        p.name for p in backward_module.graph.find_nodes(op="placeholder") if p.name in joint_name
    ]
    kept = [joint_name[p] for p in inputs if p not in hosts]
    offloaded = [joint_name[p] for p in inputs if p in hosts]
    made = Counter(v for v, k in order if (v, k) in live)
    recomputes = {v: c - 1 for v, c in made.items() if c > 1}
    return Partition(forward, backward_module, kept, recomputes, dead, offloaded)


def _drop_unread_draws(backward: torch.fx.GraphModule) -> None:
    """Erase the random ops of ``backward`` that nothing reads, and what only they read.

    torch's extraction copies into each graph every node whose inputs that graph has, so a
    forward draw whose inputs the backward holds too (a stochastic-depth mask drawn into
    ``torch.empty``, a dropout of a saved value) is copied into the backward, unread; its dead
    code elimination keeps a random op wherever inductor's ``fallback_random`` is set (in a
    tracing context, `torch.fx.Graph.eliminate_dead_code`), so the backward would draw again
    and leave the generator ahead of eager's: the next step draws other masks. torch's own
    partition drops them by rebuilding the backward from its outputs. Every draw of the
    schedule is made where it is live (a random op's first compute is in the forward, and a
    recompute nothing reads is dead, `partition`), so an unread draw in the backward is
    always such a copy."""
    graph = backward.graph
    for node in reversed(graph.nodes):
        if not node.users and not _impure_unless_drawing(node):
            graph.erase_node(node)
    backward.recompile()


def _impure_unless_drawing(node: torch.fx.Node) -> bool:
    """`torch.fx.Node.is_impure`, an op that draws random numbers and mutates nothing counted
    pure."""
    target = node.target
    if node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(
        target, "tags", ()
    ):
        schema = getattr(target, "_schema", None)
        if schema is None or not schema.is_mutable:
            return False
    return node.is_impure()


def _base_in(node: torch.fx.Node, names: Sequence[str]) -> bool:
    """Whether ``node`` views the storage of another of ``names`` (its DAG node's members)."""
    base = _view_base(node)
    return base is not None and base.name in names


def _keep_alive_where_read(
    graph: torch.fx.Graph,
    waits: list[tuple[torch.fx.Node, torch.fx.Node]],
    escaping: set[torch.fx.Node],
) -> None:
    """Drop an offload wait's keepalive (which frees the source's storage) where a tensor of
    that storage is read after the wait, saved or returned (``escaping``), or the storage is
    a graph input's (a view of a parameter)."""
    position = {n: k for k, n in enumerate(graph.nodes)}
    sharing: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        sharing.setdefault(_view_root(node), []).append(node)
    for wait, source in waits:
        if wait not in position or len(wait.args) < 2:
            continue
        root = _view_root(source)
        aliases = sharing.get(root, [source])
        if root.op != "call_function" or any(
            a in escaping or any(position[u] > position[wait] for u in a.users if u is not wait)
            for a in aliases
        ):
            wait.args = wait.args[:1]
