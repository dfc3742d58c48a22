"""A schedule as the forward and backward graphs of a compiled step.

`executor.compiled.rewrite` rewrites the joint graph in the schedule's order; torch's own
``_extract_fwd_bwd_modules`` then cuts the rewritten joint graph at the saved set (what the
forward slice leaves live that the backward reads), so the graphs keep AOTAutograd's calling
convention (saved values, then tangents).

The graph's outputs are the forward's outputs as the forward slice leaves them (its last copy
before the split) and the gradients as the schedule's ``END`` finds them (the copy live then).
A compute whose copies nothing live reads, neither a later compute nor an output, is dead
unless it has an effect (the first compute of a node that draws random numbers or mutates): it
is left out of the graphs and listed (`Partition.dead`); every other compute of the schedule
is one copy of its DAG node's fx nodes in the forward or the backward graph. The forward saves
one tensor per storage (NOTE [one saved tensor per storage] in `executor.compiled.storage`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch._functorch.partitioners import _extract_fwd_bwd_modules

from executor.compiled import offload as transfer
from executor.compiled.joint_dag import runs_once
from executor.compiled.rewrite import COMPUTE, Compute, Rewrite, made_by
from executor.compiled.storage import one_per_storage
from executor.errors import CompileError

__all__ = ["Partition", "partition"]


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
    rewrite = Rewrite(joint, ops, members, backward, num_fwd_outputs, replay_rng, inlined or {})
    order = list(rewrite.reads)
    live = _live(order, rewrite, members)
    dead = [by for by in order if by not in live]
    gone = set(dead)
    graph, flat = rewrite.graph, rewrite.outputs
    for node in reversed(graph.nodes):
        if node.meta.get(COMPUTE) in gone or node.meta.get(transfer.FROM) in gone:
            graph.erase_node(node)
    saved = _saved(rewrite, gone)
    (output,) = joint.graph.find_nodes(op="output")
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


def _live(
    order: list[Compute], rewrite: Rewrite, members: dict[Hashable, list[str]]
) -> set[Compute]:
    """The computes of ``order`` that something live reads: those that made the graph's
    outputs, the first compute of a node that must run once (it draws or mutates), and what
    they read, back through ``rewrite.reads``."""
    live = set(rewrite.output_computes)
    live |= {(v, 0) for v, k in order if any(runs_once(rewrite.joint_nodes[m]) for m in members[v])}
    for by in reversed(order):
        if by in live:
            live |= rewrite.reads[by]
    return live


def _saved(rewrite: Rewrite, dead: set[Compute]) -> dict[torch.fx.Node, str]:
    """What the forward saves (a forward copy -> its joint name): ``rewrite.saved`` but the
    copies of ``dead`` computes, one tensor per storage."""
    saved = {copy: name for copy, name in rewrite.saved.items() if made_by(copy) not in dead}
    saved = one_per_storage(saved, rewrite.origin)
    for copy in saved:
        if not isinstance(copy.meta.get("val"), torch.Tensor):
            raise CompileError(
                f"the forward would save '{copy.name}', a {type(copy.meta.get('val')).__name__}"
                " and not a tensor; this is a defect in remat: report it with the model"
            )
    return saved


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
