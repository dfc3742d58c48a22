"""The memory model of torch's eager non-reentrant checkpoint with a SAC policy, and a plan's
predicted peak and recompute cost. This is the reference the CP-SAT model (`solver.sac.solve`)
is tested against; it is written as plain loops over the facts, sharing no code with it.

NOTE [ SAC memory model ] (torch 2.13, docs/sac.md):
  1. Forward of a checkpointed block: ops run as usual; a storage lives until the last op of the
     block reading it, longer if its op is MUST_SAVE (held until the backward). After the block,
     it holds its MUST_SAVE storages and its inputs, where the plain block holds the storages
     autograd saves: the plan *saves* `savings` bytes for every later moment until the
     block's backward. The block's output lives on either way (the next block's input).
  2. Backward of a checkpointed block: the first unpack reruns the block from its start and stops
     after op `stop` (every saved tensor recomputed). Recomputed storages that autograd saves
     stay until their unpack (after the recompute); others die after their last reader; MUST_SAVE
     storages are already there. Once the recompute ends, the block holds what the plain block
     holds, and the checkpoint still holds its extra bytes (`held_extra`): the rest of its
     backward is the plain step's (`b_peak`) plus those.
  3. Everything else is the plain step's measured memory minus the savings of the blocks whose
     forward bytes are held at that moment; the root's backward after block 0's
     (`root_b_peak`, where the recording measures it apart) holds none: every plan's is the
     plain step's.
A plan's cost (seconds) is its recompute, plus each checkpointed region's `price` (what
checkpoint costs beyond the recorded seconds of the ops it reruns), plus the SAC runtime's
`overhead` of each region that saves an op (`plan_cost`).

NOTE [ SAC offload model ] (with a host link, `solver.Link`; docs/sac.md, "Offload"): a
MUST_SAVE op of a checkpointed region may be *offloaded* (`offloadable`: it creates storage, none
of it the region's output). Its copy to the host is issued right after the op, on the one
device-to-host engine (FIFO); the region's forward waits for its copies at its end, so the
device storage lives through the forward as a kept one does (term 1 unchanged). From the
forward's end to the region's recompute the device does not hold it: the savings `d_j` grow by
its `new_bytes`, and the host holds them (`plan_host`: every offloaded byte is on the host at
once between the last forward and the first backward; each output tensor is its own host
buffer, `SacOp.host_sizes`, which the link's host allocator rounds, `Link.host_bytes`). The
recompute, on entry, issues the reloads of every offloaded op of the region in op order on the
one host-to-device engine and reads each at the op's place: the reloaded storage is on the
device through the recompute as a kept one is (term 2 unchanged). Each offloaded op costs the
runtime's `offload_seconds` (`SacProblem`). The copies overlap compute; the clock waits where a
copy has not ended (`plan_stall`): at the forward's end for the last offload, at each
reloaded op's place in the recompute for its reload. Copy seconds are `Link.offload_time` /
`Link.reload_time` of the bytes (predicted from the link's latency and bandwidth); compute
seconds are the ops' `seconds`.
A region that is not checkpointed may offload too (`plain_offloaded`): every storage its ops
create that autograd saves (`plain_offload_bytes`, its output left out) is copied to the host
at its forward's end and copied back when the backward reads it; the output's storages, which
autograd may save too (an in-place ReLU saves its result), stay on the device and are never
copied, so the host never holds them (each parked storage is its own host buffer, rounded as
an offloaded op's are). Its forward term stays the plain step's (the device holds the storages
through the forward, as the plain step does) and so does its backward's
(an upper bound: the backward reloads each only where it reads it); from its forward's end to
its backward the device does not hold them (its savings) and the host does. Its copies are
counted as if none overlapped compute: the forward's end issues them and waits for them, and
each reload is read at once.
Units: bytes and seconds.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from solver.core.link import Link
from solver.errors import InvalidPlanError
from solver.sac.problem import SacBlock, SacOp, SacProblem


@dataclass(frozen=True)
class SacPlan:
    """Per block: whether it is a checkpoint region, the indices of its MUST_SAVE ops (the
    others are MUST_RECOMPUTE) and of those of them offloaded to the host (NOTE [ SAC offload
    model ]; None: nothing offloaded). A block that is not checkpointed saves no ops."""

    checkpointed: tuple[bool, ...]
    saved: tuple[frozenset[int], ...]
    offloaded: tuple[frozenset[int], ...] | None = None
    plain_offloaded: tuple[bool, ...] | None = None

    def plain_offloads(self) -> tuple[bool, ...]:
        """Per block not checkpointed, whether its saved storages wait on the host (NOTE [ SAC
        offload model ]); False throughout where the plan offloads none."""
        return self.plain_offloaded or (False,) * len(self.checkpointed)

    def offloads(self) -> tuple[frozenset[int], ...]:
        """Per block, the offloaded ops (empty sets where the plan offloads nothing)."""
        if self.offloaded is None:
            return (frozenset(),) * len(self.checkpointed)
        return self.offloaded


def plain_offload_bytes(block: SacBlock) -> int:
    """Bytes a region that is not checkpointed offloads: the storages its ops create that
    autograd saves, its output left out."""
    return sum(op.saved_bytes for op in block.ops)


def offload_host(op: SacOp, link: Link | None) -> int:
    """Host bytes the op's offload holds: each of its host buffers (`SacOp.host_sizes`) as
    `link`'s host allocator rounds it (None: as requested)."""
    sizes = (op.new_bytes,) if op.host_sizes is None else op.host_sizes
    return _held(sizes, link)


def park_host(block: SacBlock, link: Link | None) -> int:
    """Host bytes a region that is not checkpointed holds when it parks: each saved storage
    (`SacOp.saved_sizes`, its output's left out) in its own host buffer, as `link`'s host
    allocator rounds it (None: as requested)."""
    sizes = [
        size
        for op in block.ops
        for size in ((op.saved_bytes,) if op.saved_sizes is None else op.saved_sizes)
    ]
    return _held(sizes, link)


def _held(sizes: Collection[int], link: Link | None) -> int:
    return sum(sizes) if link is None else sum(link.host_bytes(size) for size in sizes)


def plain_offload_count(block: SacBlock) -> int:
    """How many of the region's ops have storages autograd saves (each one offloaded op)."""
    return sum(1 for op in block.ops if op.saved_bytes)


def offloadable(op: SacOp) -> bool:
    """Whether a saveable op may be offloaded: it creates storage, none of it the block's
    output (which lives on the device whatever the plan)."""
    return op.saveable and op.new_bytes > 0 and op.output_bytes == 0


def forward_live(block: SacBlock, keep: Collection[int], t: int) -> int:
    """Bytes of the block's own storages live while op `t` runs in a forward that holds the
    storages of the ops in `keep` to its end, op `t`'s scratch included (NOTE [ SAC memory
    model ] 1)."""
    return block.ops[t].scratch + sum(
        op.new_bytes for i, op in enumerate(block.ops[: t + 1]) if op.last_read >= t or i in keep
    )


def recompute_live(block: SacBlock, saved: Collection[int], t: int) -> int:
    """Bytes a recompute has allocated and not yet freed while op `t` (<= stop) reruns, its
    scratch included unless it is MUST_SAVE (not rerun) (NOTE [ SAC memory model ] 2)."""
    scratch = 0 if t in saved else block.ops[t].scratch
    return scratch + sum(
        op.new_bytes if op.last_read >= t else op.saved_bytes
        for i, op in enumerate(block.ops[: t + 1])
        if i not in saved
    )


def plain_forward_live(block: SacBlock, t: int) -> int:
    """Bytes of the block's own storages live while op `t` runs in the plain forward (a
    storage autograd saves, or the block's output, is held to the end), its scratch included."""
    return block.ops[t].scratch + sum(
        op.new_bytes if op.last_read >= t else op.saved_bytes + op.output_bytes
        for op in block.ops[: t + 1]
    )


def savings(
    block: SacBlock,
    checkpointed: bool,
    saved: Collection[int],
    offloaded: Collection[int] = (),
    plain_offloaded: bool = False,
) -> int:
    """Bytes the block holds on the device between its forward and its backward less than the
    plain block (negative when the checkpoint holds more); an offloaded op's storage, and a
    plain-offloaded block's saved storages, are on the host then (NOTE [ SAC offload model ])."""
    if not checkpointed:
        return plain_offload_bytes(block) if plain_offloaded else 0
    plain = sum(op.saved_bytes for op in block.ops)
    kept = sum(block.ops[i].new_bytes - block.ops[i].output_bytes for i in saved)
    return plain - kept - block.held_extra + sum(block.ops[i].new_bytes for i in offloaded)


def check_plan(problem: SacProblem, plan: SacPlan) -> None:
    """ValueError unless the plan fits the problem: one entry per block, saved ops saveable,
    at most `stop`, and only in checkpointed blocks; offloaded ops saved and offloadable."""
    n = len(problem.blocks)
    offloads, plain = plan.offloads(), plan.plain_offloads()
    if len({len(plan.checkpointed), len(plan.saved), len(offloads), len(plain), n}) != 1:
        raise InvalidPlanError(f"plan has {len(plan.checkpointed)} blocks, the problem {n}")
    for block, ckpt, saved, off, whole in zip(
        problem.blocks, plan.checkpointed, plan.saved, offloads, plain, strict=True
    ):
        if whole and (ckpt or not plain_offload_bytes(block)):
            raise InvalidPlanError(f"block {block.name} cannot offload its saved storages")
        if saved and not ckpt:
            raise InvalidPlanError(f"block {block.name} saves ops but is not checkpointed")
        for i in saved:
            if not (0 <= i <= block.stop and block.ops[i].saveable):
                raise InvalidPlanError(f"op {i} of block {block.name} cannot be MUST_SAVE")
        for i in off:
            if i not in saved or not offloadable(block.ops[i]):
                raise InvalidPlanError(f"op {i} of block {block.name} cannot be offloaded")


def plan_terms(problem: SacProblem, plan: SacPlan) -> list[tuple[str, int, int]]:
    """Every term of the plan's predicted peak (bytes above the bytes live before the step),
    as (kind, index, bytes): ("segment", i, ...) for `problem.segments[i]`, ("root", 0, ...)
    for the root's backward after block 0's (where measured apart), ("forward", j, ...)
    and ("backward", j, ...) for block j's forward (its plain peak, or each op of a
    checkpointed forward) and backward (its plain peak plus what a checkpoint holds, and each
    op of its recompute)."""
    check_plan(problem, plan)
    d = [
        savings(b, c, s, o, p)
        for b, c, s, o, p in zip(
            problem.blocks,
            plan.checkpointed,
            plan.saved,
            plan.offloads(),
            plan.plain_offloads(),
            strict=True,
        )
    ]
    before = [sum(d[:j]) for j in range(len(d) + 1)]  # savings held by blocks 0..j-1
    terms = [("segment", i, seg.peak - before[seg.held]) for i, seg in enumerate(problem.segments)]
    if problem.root_b_peak is not None:  # the root's backward: every block's is over
        terms.append(("root", 0, problem.root_b_peak))
    for j, (block, ckpt, saved) in enumerate(
        zip(problem.blocks, plan.checkpointed, plan.saved, strict=True)
    ):
        if not ckpt:
            terms.append(("backward", j, block.b_peak - before[j]))
            terms.append(("forward", j, block.f_peak - before[j]))
            continue
        terms.append(("backward", j, block.b_peak - before[j] + block.held_extra))
        for t in range(len(block.ops)):
            live = forward_live(block, saved, t)
            terms.append(("forward", j, block.f_start - before[j] + block.workspace + live))
        # the recompute holds the offloaded storages again, reloaded at its start
        held = savings(block, ckpt, saved)
        base = block.b_start - before[j] - held + block.workspace + block.recompute_extra
        for t in range(block.stop + 1):  # none when nothing is saved: no unpack, no recompute
            terms.append(("backward", j, base + recompute_live(block, saved, t)))
    return terms


def plan_peak(problem: SacProblem, plan: SacPlan) -> int:
    """Predicted peak bytes of the step under the plan, above the bytes live before it."""
    return max(value for _, _, value in plan_terms(problem, plan))


def plan_host(problem: SacProblem, plan: SacPlan, link: Link | None = None) -> int:
    """Bytes the plan's host copies hold at their most: every offloaded op's host buffers and
    every parked storage's, all on the host between the last block's forward and the first
    block's backward (NOTE [ SAC offload model ]), each as `link`'s host allocator rounds it
    (`offload_host`, `park_host`; None: as requested)."""
    check_plan(problem, plan)
    plain = sum(
        park_host(b, link) for b, p in zip(problem.blocks, plan.plain_offloads(), strict=True) if p
    )
    return plain + sum(
        offload_host(block.ops[i], link)
        for block, off in zip(problem.blocks, plan.offloads(), strict=True)
        for i in off
    )


def block_stall(block: SacBlock, saved: Collection[int], offloaded: Collection[int], link: Link):
    """Seconds the clock waits for the block's copies (NOTE [ SAC offload model ]): its
    forward, run op by op, issues each offload after its op on the FIFO device-to-host engine
    and waits for the last at its end; its recompute issues every reload at its start on the
    FIFO host-to-device engine, reruns each op up to `stop` that is not saved, and waits at each
    offloaded op's place for its reload."""
    clock = engine = 0.0
    for i, op in enumerate(block.ops):
        clock += op.seconds
        if i in offloaded:
            engine = max(engine, clock) + link.offload_time(op.new_bytes)
    stall = max(0.0, engine - clock)
    clock = arrived = 0.0
    for i, op in enumerate(block.ops[: block.stop + 1]):
        if i in offloaded:
            arrived += link.reload_time(op.new_bytes)
            if arrived > clock:
                stall, clock = stall + arrived - clock, arrived
        elif i not in saved:
            clock += op.seconds
    return stall


def plan_stall(problem: SacProblem, plan: SacPlan, link: Link | None) -> float:
    """Seconds the plan's copies stall the step (`block_stall` per block); 0 without a link
    (and then the plan may offload nothing)."""
    check_plan(problem, plan)
    if link is None:
        if any(plan.offloads()) or any(plan.plain_offloads()):
            raise InvalidPlanError("the plan offloads ops: give the link it was solved with")
        return 0.0
    plain = sum(
        link.offload_time(plain_offload_bytes(b)) + link.reload_time(plain_offload_bytes(b))
        for b, p in zip(problem.blocks, plan.plain_offloads(), strict=True)
        if p
    )
    return plain + sum(
        block_stall(b, s, o, link)
        for b, s, o in zip(problem.blocks, plan.saved, plan.offloads(), strict=True)
    )


def plan_cost(problem: SacProblem, plan: SacPlan, link: Link | None = None) -> float:
    """Modelled seconds the plan adds to the step: every op up to `stop` of a checkpointed block
    that is not MUST_SAVE reruns once, a checkpointed block pays its `price`, and one with a
    MUST_SAVE op its `overhead` (the SAC runtime; a block saving nothing runs as plain
    checkpoint); plus the stall of its copies over `link` (`plan_stall`, predicted) and the
    runtime's `offload_seconds` per offloaded op."""
    check_plan(problem, plan)
    recompute = sum(
        op.seconds
        for block, ckpt, saved in zip(problem.blocks, plan.checkpointed, plan.saved, strict=True)
        if ckpt
        for i, op in enumerate(block.ops[: block.stop + 1])
        if i not in saved
    )
    runtime = sum(
        block.overhead
        for block, ckpt, saved in zip(problem.blocks, plan.checkpointed, plan.saved, strict=True)
        if ckpt and saved
    )
    price = sum(
        block.price for block, ckpt in zip(problem.blocks, plan.checkpointed, strict=True) if ckpt
    )
    count = sum(len(o) for o in plan.offloads()) + sum(
        plain_offload_count(b)
        for b, p in zip(problem.blocks, plan.plain_offloads(), strict=True)
        if p
    )
    offloads = count * problem.offload_seconds
    return recompute + price + runtime + plan_stall(problem, plan, link) + offloads
