"""What a SAC plan is solved over: each block's dispatched forward ops and the plain step's
measured memory around the blocks. Bytes are bytes, costs are seconds (measured per op).

The plain step is the training step without checkpointing. Blocks run their forwards in order
0..n-1 and their backwards in reverse. Its measured memory (bytes above the step's start) is
cut at the blocks' boundaries:

- a block's forward window (`f_start`, `f_peak`): live bytes when it starts and the most inside;
- its backward window (`b_start`, `b_peak`): from the moment the gradient of its output is
  complete (its first backward op is next) until the next block's backward window starts (for
  block 0, until the step ends);
- `segments`: every other stretch of the step, each with its peak and how many leading blocks
  (`held`) hold their forward bytes during it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SacOp:
    """One dispatched op of a block's forward, as the SAC policy sees it (its position in the
    block's stream is its index).

    `name`: the op (`aten.addmm.default`). `new_bytes`: bytes of the storages it creates (0 when
    its outputs alias inputs or tensors from outside the block). `seconds`: its measured time
    (scaled down where the block's measured recompute is less: `SacBlock.price`).
    `last_read`: index of the last op of the block reading those storages (its own index if
    none; the block's output counts as read to the end). `saved_bytes`: bytes of its storages
    the plain forward saves for backward (autograd's saved tensors), the block's output left
    out. `saveable`: whether MUST_SAVE is offered: new storage that no later op mutates, from a
    non-random op. `scratch`: bytes the op holds during its call beyond its outputs (kernel
    workspace). `output_bytes`: bytes of its storages that are the block's output, live after
    the block whatever the plan (the next block's input). `host_sizes`: bytes of each host
    buffer its offload allocates, one per output tensor (numel times element size: what the
    runtime's copy of it takes); None: one buffer of `new_bytes`. `saved_sizes`: bytes of each
    storage in `saved_bytes` as requested (a parked region copies each whole storage to its
    own host buffer); None: one storage of `saved_bytes`. The host allocator rounds each size
    (`solver.Link.host_bytes`).
    """

    name: str
    new_bytes: int
    seconds: float
    last_read: int
    saved_bytes: int
    saveable: bool
    scratch: int = 0
    output_bytes: int = 0
    host_sizes: tuple[int, ...] | None = None
    saved_sizes: tuple[int, ...] | None = None

    @classmethod
    def from_json(cls, d: dict) -> SacOp:
        sizes = {k: tuple(d[k]) for k in ("host_sizes", "saved_sizes") if d.get(k) is not None}
        return cls(**{**d, **sizes})


@dataclass(frozen=True)
class SacBlock:
    """A block (a candidate checkpoint region) and its plain step's measured windows.

    `stop`: the index of the op after which a recompute stops (every saved tensor recomputed:
    torch's early stop). `held_extra`: bytes a checkpoint holds that the plain block does not
    (its tensor inputs the plain block does not save, and the RNG state it keeps).
    `workspace`: bytes the plain forward's measured peak exceeds the op-level model (liveness
    and each op's scratch) by, added to the modelled forward and recompute. `recompute_extra`: bytes
    a recompute allocates besides the block's ops (the RNG state torch saves around it).
    `overhead`: seconds a step pays for running the block under a SAC policy rather than plain
    checkpoint (the policy's dispatch modes in its forward and recompute, its op-stream check),
    measured; paid by a region that saves at least one op, not by one that saves none (it runs
    as plain checkpoint). `price`: seconds a checkpointed region pays beyond the recorded
    `seconds` of the ops it reruns (checkpoint's own machinery: saving inputs and RNG state, the
    recompute's Python code, the unpack hooks; and the recorded seconds' error): the region's
    step under plain checkpoint minus without checkpoint, run alone and measured, less the
    recorded seconds of every op up to `stop`. Paid by every checkpointed region. Recorded at
    least 0: where the measured price is less than those seconds, the ops' `seconds` up to
    `stop` are scaled down to it instead (executor/sac/recording/record.py); the solver takes any
    sign. `buffers`: names (relative to the region) of the buffers its forward mutates (BatchNorm's
    running statistics), restored around its recompute; their bytes are in `held_extra` (a
    copy from before the forward) and in `recompute_extra` (a copy during the recompute).
    """

    name: str
    ops: tuple[SacOp, ...]
    stop: int
    held_extra: int
    workspace: int
    f_start: int
    f_peak: int
    b_start: int
    b_peak: int
    recompute_extra: int = 0
    overhead: float = 0.0
    price: float = 0.0
    buffers: tuple[str, ...] = ()

    def to_json(self) -> dict:
        d = asdict(self)
        d["ops"] = [asdict(op) for op in self.ops]
        d["buffers"] = list(self.buffers)
        return d

    @classmethod
    def from_json(cls, d: dict) -> SacBlock:
        ops = tuple(SacOp.from_json(op) for op in d["ops"])
        return cls(**{**d, "ops": ops, "buffers": tuple(d.get("buffers", ()))})


@dataclass(frozen=True)
class Segment:
    """A stretch of the plain step outside the blocks' windows: its peak bytes, with blocks
    0..held-1 holding their forward bytes."""

    peak: int
    held: int


@dataclass(frozen=True)
class SacProblem:
    """Blocks in forward order, the other stretches, and the plain step's peak: measured, or
    predicted in estimate mode (`plain_peak_basis`). `offload_seconds`: seconds the runtime
    spends per offloaded op besides its copies (its Python: the pack, the cache entry's swap,
    the reload's issue and read; measured, executor/sac/runtime/offload.py), 0 where the plan cannot
    offload. `backward_start`, `root_b_start`, `root_b_peak`, `end`: the plain step's bytes live
    when its backward starts, when block 0's backward ends, the most from then on, and at its
    end (`solver.sac.windows.Windows`; None: not recorded); `largest`: per window, the largest
    allocation made in it and live at its peak, (window, what, bytes), where the measurer
    names them (estimate mode)."""

    blocks: tuple[SacBlock, ...]
    segments: tuple[Segment, ...]
    plain_peak: int
    plain_peak_basis: str = "measured"
    offload_seconds: float = 0.0
    backward_start: int | None = None
    root_b_start: int | None = None
    root_b_peak: int | None = None
    end: int | None = None
    largest: tuple[tuple[str, str, int], ...] = ()

    def to_json(self) -> dict:
        return {
            "blocks": [b.to_json() for b in self.blocks],
            "segments": [asdict(s) for s in self.segments],
            "plain_peak": self.plain_peak,
            "plain_peak_basis": self.plain_peak_basis,
            "offload_seconds": self.offload_seconds,
            "backward_start": self.backward_start,
            "root_b_start": self.root_b_start,
            "root_b_peak": self.root_b_peak,
            "end": self.end,
            "largest": [list(x) for x in self.largest],
        }

    @classmethod
    def from_json(cls, d: dict) -> SacProblem:
        return cls(
            tuple(SacBlock.from_json(b) for b in d["blocks"]),
            tuple(Segment(**s) for s in d["segments"]),
            int(d["plain_peak"]),
            str(d.get("plain_peak_basis", "measured")),
            float(d.get("offload_seconds", 0.0)),
            d.get("backward_start"),
            d.get("root_b_start"),
            d.get("root_b_peak"),
            d.get("end"),
            tuple((str(w), str(what), int(b)) for w, what, b in d.get("largest", ())),
        )
