"""Per-rank memory of a training step under FSDP2 (`fully_shard` per block and at the root), as a
model: torch-free, bytes throughout.

NOTE [ FSDP2 memory model ] (torch 2.13, torch/distributed/fsdp/_fully_shard/: _fsdp_param.py,
_fsdp_param_group.py, _fsdp_collectives.py, _fsdp_state.py; docs/fsdp.md)

A group is the parameters of one `fully_shard` call: each block's, and the root's remaining ones
(embeddings, final norm, head). W is `world_size`; a parameter of shape (d0, *rest) has the
padded shard numel s = ceil(d0 / W) * prod(rest) (FSDP2 pads dim 0 to a multiple of W).
Dtypes: master (the sharded parameters, their gradients, the optimizer state), param (gathered,
compute and unsharded gradients: the policy's `param_dtype`, else master) and reduce (the
reduce-scatter: `reduce_dtype`, else param). Every allocation is rounded up to `rounding`.

Resident before the step (`.grad` None, as after `zero_grad(set_to_none=True)`):
- sharded parameters: one padded storage per parameter, s x master;
- optimizer state, per parameter on rank `rank`, of its local (unpadded) rows: AdamW 2 x local
  x master (and the `step` counter, 4 bytes, where it lives on the device), SGD with momentum
  1 x local x master, SGD none.

The step, in the order torch allocates and frees (per group g: AG = one flat buffer of
W x sum(s) x param; U = one storage per parameter of W x s x param, the unsharded parameters;
C = one flat buffer of sum(s) x param, the all-gather input cast to the param dtype, only under
mixed precision; S = one flat buffer of W x sum(s) x reduce, the reduce-scatter input; O = one
flat buffer of sum(s) x reduce, its output; O' = its cast to master where reduce != master,
the sharded gradient, viewed per parameter):

1. Unshard (`foreach_all_gather`, `wait_for_unshard`): C and AG allocated, the all-gather, C
   freed on return; the copy-out allocates U, then AG is freed, except in forward, where it is
   held until the next group's copy-out starts (implicit prefetch: [Note: Overlapping
   all-gather copy-in and all-gather]) and the last one until the root's forward ends.
2. Forward: the root unshards first and stays unsharded until its post-backward (the root is
   not resharded after forward); each block unshards in its pre-forward and frees U in its
   post-forward (`reshard_after_forward`; False: U stays to the block's post-backward).
3. Backward: the root's pre-backward (on the loss's gradient) prefetches the last block's AG;
   block k's pre-backward copies out (U_k, AG_k freed) and prefetches block k-1's AG; a
   checkpoint's recompute runs on U_k (no gather). Autograd creates block k's unsharded
   gradients (param dtype, unpadded: as in a single-process step). Block k's post-backward
   frees U_k, frees the previous group's S (held one group: `reduce_scatter_states`),
   allocates S_k (the gradients copied in), frees the unsharded gradients, allocates O_k (and
   O'_k, freeing O_k) and keeps the sharded gradient. The root's post-backward runs in the
   final callback: U_root freed, the last S freed, the root's S, O, O' as above, its S freed.
4. After the step: resident + the sharded gradients (sum(s) x master per group).

The step's activation memory is that of the single-process step on one rank's batch with the
parameters in the param dtype (`StepWindows`); its parameters' gradients are the unsharded
gradients above, so the FSDP bytes of a moment count minus the unsharded block gradients FSDP
has freed by then. World size 1 gathers nothing (AG 0) but copies into U as above.
Collectives: NCCL allocates nothing through the caching allocator; gloo (measured on CPU,
torch 2.13) allocates a copy of the all-gather output while it gathers (AG more, twice in
turn) and a copy of the reduce-scatter input while it reduces (S more, O live, the unsharded
gradients freed). Not modelled:
gradient accumulation without reduction, HSDP, CPU offload, explicit prefetch settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from solver.errors import ArgumentError

Shape = tuple[int, ...]
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
OPTIMIZERS = ("adamw", "sgd", "sgd_momentum", "none")
BACKENDS = ("nccl", "gloo")
"""The collectives' libraries modelled; the first is `FsdpPolicy`'s default."""


def nccl_communicators(backend: str) -> int:
    """NCCL communicators each rank's process holds (`Device.usable`) over ``backend``: 1 over
    NCCL (FSDP2 gathers and reduces over one process group), 0 over gloo."""
    return 1 if backend == "nccl" else 0


STEP_COUNTER_BYTES = 4  # torch.optim's float32 `step` scalar per parameter


def _itemsize(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ArgumentError(
            f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}"
        ) from None


@dataclass(frozen=True)
class FsdpPolicy:
    """How the model is sharded and trained, per rank.

    `world_size`: ranks sharding each group. `master_dtype`: the sharded parameters' dtype.
    `param_dtype`, `reduce_dtype`: `MixedPrecisionPolicy`'s (None: as torch, master and param).
    `optimizer`: "adamw", "sgd", "sgd_momentum" or "none". `reshard_after_forward`: the blocks'
    (the root is never resharded after forward). `rounding`: the allocator's block, bytes
    (`Device.rounding`: 512 on CUDA, 1 on CPU). `rank`: whose local rows the optimizer state
    holds (rank 0 has the most). `step_counters_on_device`: AdamW's per-parameter `step`
    scalars are on the device (True on CPU; on CUDA they are host tensors unless
    capturable/fused). `backend`: the collectives' library; "gloo" allocates scratch through
    the allocator (module docstring), "nccl" none."""

    world_size: int
    master_dtype: str = "float32"
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    optimizer: str = "adamw"
    reshard_after_forward: bool = True
    rounding: int = 1
    rank: int = 0
    step_counters_on_device: bool = False
    backend: str = BACKENDS[0]

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"need world_size >= 1 and 0 <= rank < world_size: {self}")
        if self.optimizer not in OPTIMIZERS:
            raise ArgumentError(f"optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.backend not in BACKENDS:
            raise ArgumentError(f"backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.rounding < 1:
            raise ArgumentError(f"rounding must be at least 1 byte, not {self.rounding}")
        for dtype in (self.master_dtype, self.param_dtype, self.reduce_dtype):
            if dtype is not None:
                _itemsize(dtype)

    @property
    def compute_dtype(self) -> str:
        """The gathered parameters' and unsharded gradients' dtype."""
        return self.param_dtype or self.master_dtype

    @property
    def reduce(self) -> str:
        """The reduce-scatter's dtype."""
        return self.reduce_dtype or self.compute_dtype

    def round(self, nbytes: int) -> int:
        return -(-nbytes // self.rounding) * self.rounding

    @property
    def nccl_communicators(self) -> int:
        """`nccl_communicators` of this policy's backend."""
        return nccl_communicators(self.backend)


@dataclass(frozen=True)
class Moment:
    """A moment of the step: the FSDP bytes live then, above the resident ones, met with the
    activation bytes of `window` at `level` ("start", "peak" or "end" of that window, see
    `StepWindows`). `parts`: the buffers, named."""

    window: str
    level: str
    fsdp_bytes: int
    parts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class FsdpMemory:
    """`resident`: bytes before the step (`resident_parts`: "sharded params", "optimizer
    state"); `moments`: the step's, in order; `after`: bytes above `resident` after the step
    (the sharded gradients); `unsharded_grads`: per block, then the root, bytes of the unsharded
    gradients autograd creates (param dtype), what a single-process step holds for them;
    `optimizer_temporaries`: bytes the optimizer's step allocates above `resident` + `after`
    (AdamW's foreach step: one tensor of the local rows per parameter, master dtype, the square
    roots of the second moments; SGD none)."""

    resident: int
    resident_parts: dict[str, int]
    moments: tuple[Moment, ...]
    after: int
    unsharded_grads: tuple[int, ...]
    optimizer_temporaries: int = 0

    def max_fsdp_bytes(self, window: str | None = None) -> int:
        """The most FSDP bytes of any moment (of `window`, if given), above the resident."""
        return max(m.fsdp_bytes for m in self.moments if window in (None, m.window))


def _numels(shape: Shape, world_size: int, rank: int) -> tuple[int, int, int]:
    """(numel, padded shard numel, rank's local numel) of a parameter."""
    if not shape or min(shape) < 0:
        raise ArgumentError(
            f"parameter shape {shape!r}: FSDP2 shards dim 0 of a tensor of dim >= 1"
        )
    rest = math.prod(shape[1:])
    rows = -(-shape[0] // world_size)
    local = max(0, min(rows, shape[0] - rank * rows))
    return shape[0] * rest, rows * rest, local * rest


class _Group:
    """One group's buffer sizes under the policy (module docstring)."""

    def __init__(self, shapes: Sequence[Shape], p: FsdpPolicy) -> None:
        w = p.world_size
        sizes = [_numels(tuple(s), w, p.rank) for s in shapes]
        shard = sum(s for _, s, _ in sizes)
        cp, rd, ms = (_itemsize(d) for d in (p.compute_dtype, p.reduce, p.master_dtype))
        self.params = sum(p.round(s * ms) for _, s, _ in sizes)
        self.local = [n for _, _, n in sizes]
        self.ag = p.round(w * shard * cp) if w > 1 else 0
        self.u = sum(p.round(w * s * cp) for _, s, _ in sizes)
        self.c = p.round(shard * cp) if p.compute_dtype != p.master_dtype else 0
        self.s = p.round(w * shard * rd)
        self.o = p.round(shard * rd)
        self.cast = p.round(shard * ms) if p.reduce != p.master_dtype else 0
        self.grads = sum(p.round(n * cp) for n, _, _ in sizes)


class _Timeline:
    """FSDP buffers live, by name, and the moments recorded."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        self.moments: list[Moment] = []

    def alloc(self, name: str, nbytes: int) -> None:
        if nbytes:
            self.live[name] = nbytes

    def free(self, name: str) -> None:
        self.live.pop(name, None)

    def mark(self, window: str, level: str) -> None:
        parts = tuple(self.live.items())
        self.moments.append(Moment(window, level, sum(b for _, b in parts), parts))


class _Collectives:
    """FSDP2's collectives, each on one group, as the buffers they allocate and free on the
    timeline `t` (`gloo`: the gloo backend, whose collectives add a scratch copy)."""

    def __init__(self, t: _Timeline, gloo: bool) -> None:
        self.t = t
        self.gloo = gloo

    def unshard(self, name: str, g: _Group, window: str, level: str) -> None:
        self.t.alloc(f"all-gather copy-in {name}", g.c)
        self.t.alloc(f"all-gather {name}", g.ag)
        self.t.alloc("gloo all-gather scratch", g.ag if self.gloo else 0)
        self.t.mark(window, level)
        self.t.free("gloo all-gather scratch")
        self.t.free(f"all-gather copy-in {name}")

    def copy_out(self, name: str, g: _Group, window: str, forward: bool, held: str | None) -> None:
        """In forward, the all-gather output `held` is freed first and this one held."""
        if held is not None:
            self.t.free(f"all-gather {held}")
        self.t.alloc(f"unsharded {name}", g.u)
        self.t.mark(window, "start")
        if not forward:
            self.t.free(f"all-gather {name}")

    def reduce(self, name: str, g: _Group, previous: str | None, window: str) -> None:
        self.t.free(f"unsharded {name}")
        if previous is not None:
            self.t.free(f"reduce-scatter input {previous}")
        self.t.alloc(f"reduce-scatter input {name}", g.s)
        self.t.mark(window, "end")
        self.t.alloc(f"unsharded grads freed {name}", -g.grads)
        self.t.alloc(f"reduce-scatter output {name}", g.o)
        self.t.alloc("gloo reduce-scatter scratch", g.s if self.gloo else 0)
        self.t.mark(window, "end")
        self.t.free("gloo reduce-scatter scratch")
        if g.cast:
            self.t.alloc(f"sharded grads {name}", g.cast)
            self.t.mark(window, "end")
            self.t.free(f"reduce-scatter output {name}")
        else:
            self.t.live[f"sharded grads {name}"] = self.t.live.pop(f"reduce-scatter output {name}")


def _resident(groups: list[_Group], top: _Group, p: FsdpPolicy) -> tuple[dict[str, int], int]:
    """What each rank holds throughout, by part (the sharded parameters, the optimizer
    state), and the bytes of its local shards in the master dtype."""
    ms = _itemsize(p.master_dtype)
    per_param = {"adamw": 2, "sgd_momentum": 1}.get(p.optimizer, 0)
    locals_ = [n for g in (*groups, top) for n in g.local]
    local_bytes = sum(p.round(n * ms) for n in locals_)
    state = per_param * local_bytes
    if p.optimizer == "adamw" and p.step_counters_on_device:
        state += len(locals_) * p.round(STEP_COUNTER_BYTES)
    resident_parts = {
        "sharded params": sum(g.params for g in (*groups, top)),
        "optimizer state": state,
    }
    return resident_parts, local_bytes


def fsdp_memory(
    blocks: Sequence[Sequence[Shape]], root: Sequence[Shape], policy: FsdpPolicy
) -> FsdpMemory:
    """FSDP2's per-rank memory for blocks sharded in forward order (`blocks[k]`: the shapes of
    block k's parameters) and the root's remaining parameters (`root`; a tied parameter once),
    trained under `policy` (NOTE [ FSDP2 memory model ])."""
    p = policy
    groups = [_Group(shapes, p) for shapes in blocks]
    top = _Group(root, p)
    resident_parts, local_bytes = _resident(groups, top, p)
    n = len(groups)
    t = _Timeline()
    c = _Collectives(t, p.backend == "gloo")
    c.unshard("root", top, "root forward", "start")
    c.copy_out("root", top, "root forward", forward=True, held=None)
    t.mark("root forward", "peak")
    held = "root"
    for k, g in enumerate(groups):
        window = f"forward {k}"
        c.unshard(str(k), g, window, "start")
        c.copy_out(str(k), g, window, forward=True, held=held)
        held = str(k)
        t.mark(window, "peak")
        if p.reshard_after_forward:
            t.free(f"unsharded {k}")
        if k < n - 1:
            t.mark(f"between {k}", "peak")
    t.mark("head", "peak")
    t.free(f"all-gather {held}")  # the root's post-forward frees the last one held
    if n and p.reshard_after_forward:  # the root's pre-backward, as the backward starts
        c.unshard(str(n - 1), groups[-1], "head", "start")
    t.mark("head", "peak")
    previous = None
    for k in reversed(range(n)):
        window, g = f"backward {k}", groups[k]
        if p.reshard_after_forward:
            c.copy_out(str(k), g, window, forward=False, held=None)
            if k > 0:
                c.unshard(str(k - 1), groups[k - 1], window, "start")
        t.mark(window, "peak")
        c.reduce(str(k), g, previous, window)
        previous = str(k)
    t.mark("root backward", "peak")  # the root's own backward (embeddings), before its reduce
    c.reduce("root", top, previous, "root backward")
    t.free("reduce-scatter input root")
    after = sum(b for name, b in t.live.items() if name.startswith("sharded grads"))
    return FsdpMemory(
        resident=sum(resident_parts.values()),
        resident_parts=resident_parts,
        moments=tuple(t.moments),
        after=after,
        unsharded_grads=tuple(g.grads for g in (*groups, top)),
        optimizer_temporaries=local_bytes if p.optimizer == "adamw" else 0,
    )
