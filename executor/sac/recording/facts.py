"""What a recording records per op and per block of an op stream (`OpFacts`, `BlockFacts`,
filled by `executor.sac.recording.op_streams`), and a block's facts as the solver's torch-free block
(`sac_block`: a `solver.sac.SacBlock` of `SacOp`s, bytes per kind of storage, seconds the
median of the measured ones)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from solver.sac import SacBlock, SacOp
from solver.sac.memory import plain_forward_live


@dataclass
class OpFacts:
    name: str
    last_read: int
    random: bool
    seconds: list[float] = field(default_factory=list)
    storages: dict[int, int] = field(default_factory=dict)  # new storage -> bytes
    saved: set[int] = field(default_factory=set)  # of those, the ones autograd saves
    outputs: set[int] = field(default_factory=set)  # and the block's outputs
    mutated: bool = False
    scratch: int = 0
    host_sizes: tuple[int, ...] = ()  # bytes of a host copy of each output tensor
    requested: dict[int, int] = field(default_factory=dict)  # new storage -> bytes, unrounded


@dataclass
class BlockFacts:
    ops: list[OpFacts] = field(default_factory=list)
    stop: int = -1
    inputs: dict[int, int] = field(default_factory=dict)  # storage -> bytes
    packed: set[int] = field(default_factory=set)  # storages autograd saved
    buffers: dict[str, int] = field(default_factory=dict)  # mutated buffer -> bytes


def _op(o: OpFacts) -> SacOp:
    """The torch-free op: bytes per kind of storage, the median of its measured seconds, and
    the sizes of the host buffers its offload and a park of its saved storages allocate."""
    new_bytes = sum(o.storages.values())
    return SacOp(
        name=o.name,
        new_bytes=new_bytes,
        seconds=statistics.median(o.seconds),
        last_read=o.last_read,
        saved_bytes=sum(o.storages[s] for s in o.saved - o.outputs),
        saveable=new_bytes > 0 and not o.mutated and not o.random,
        scratch=o.scratch,
        output_bytes=sum(o.storages[s] for s in o.outputs),
        host_sizes=o.host_sizes,
        saved_sizes=tuple(sorted(o.requested[s] for s in o.saved - o.outputs)),
    )


def sac_block(
    name: str,
    f: BlockFacts,
    window: tuple[int, int, int, int],
    params: set[int],
    rng_bytes: int,
) -> SacBlock:
    """The torch-free block of recorded facts and its plain windows (f_start, f_peak, b_start,
    b_peak), its `workspace` the plain forward's measured peak beyond the op-level model;
    `rng_bytes` the RNG state a checkpoint keeps (`Measurer.rng_state_bytes`)."""
    ops = tuple(_op(o) for o in f.ops)
    copies = sum(f.buffers.values())  # the mutated buffers' values from before the forward
    held_extra = (
        rng_bytes
        + copies
        + sum(nbytes for s, nbytes in f.inputs.items() if s not in f.packed and s not in params)
    )
    block = SacBlock(name, ops, f.stop, held_extra, 0, *window, buffers=tuple(sorted(f.buffers)))
    modelled = max((plain_forward_live(block, t) for t in range(len(ops))), default=0)
    workspace = max(0, window[1] - window[0] - modelled)
    return replace(block, workspace=workspace, recompute_extra=rng_bytes + copies)
