"""`fit`: the largest batch (or sequence length) whose training step fits a device's memory,
proven in the solver's model and run, all within one deadline.

    fit(factory, "24GiB", dim="batch", max_overhead=1.3, optimizer="adamw", time_limit=60,
        offload=None)
      SizedGraphs(factory, capture_sizes)   the DAG at any size: captures, affine between them;
                                            `stable_from` skips small sizes whose graph differs
      Steps.prepare                         what exists before a step, measured (StaticBytes)
      largest_fitting                       the largest size whose least peak within the cap
                                            fits the memory left to the step, proof at size + 1
      confirmation                          the answer and the least size proven not to fit,
                                            captured where they were predicted: equal to the
                                            prediction, the proofs hold on them; else a second
                                            search over captures at every size
      run_step                              one real step at the size under remat's executor
      eager                                 the largest size eager trains in, measured
      per_block                             per-block checkpointing's largest size within the
                                            cap (predicted)

NOTE [one deadline]: `time_limit` bounds the whole call, captures and steps included, as
`solver.solve`'s does: one `Deadline` (with the first Ctrl-C's `Stop`) is made at the call and
passed down; the search and its second run take shares of it, the solves inside take it whole,
and each capture and real step starts only where the time left holds it (`expected_seconds`).
When it passes, the call returns what is proven by then and names what is open or not done.

Memory as the device counts it (`executor.fitting.memory`): parameters, gradients, optimizer state
(after one real step), buffers and inputs exist before the step; the step's budget is the memory
less those, and the optimizer step's own temporaries must fit in it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import torch

from executor.errors import FitError, PlanError
from executor.fitting.baselines import Steps, eager, per_block, run_step
from executor.fitting.fsdp import fsdp_bytes
from executor.fitting.graphs import SizedGraphs, with_loss
from executor.fitting.memory import FSDP_OPTIMIZERS, OPTIMIZERS, predicted_static
from executor.fsdp import fsdp_policy, resolve_policy, sharded_world_size
from executor.loss import default_loss
from graph_capture.measurement.roofline import resolve_target
from solver.core.budget import LEAST, PERCENT, USABLE, Budget, parse_overhead
from solver.core.link import Link
from solver.core.schedule import Schedule
from solver.deadline import Deadline
from solver.fitting.fsdp import FsdpBytes
from solver.fitting.result import (
    Fit,
    StaticBytes,
    StaticBytesError,
    affine_static,
    cut_short,
    eager_above,
)
from solver.fitting.search import FitResult, confirmed, largest_fitting
from solver.interrupt import call_deadline
from solver.target import Device, FsdpPolicy
from solver.target.devices import host_link

SEARCH_SHARE = 0.6
"""The share of the time left that a search gets; the rest is for the confirming captures, the
real steps and the baselines (and, where a capture refutes the prediction, the second search)."""


def fit(
    factory: Callable[[int], object],
    memory: int | str | None,
    dim: str = "batch",
    max_overhead: float | str | None = None,
    optimizer: str = "adamw",
    time_limit: float = 60.0,
    *,
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
    capture_sizes: Sequence[int] = (2, 3, 4),
    low: int = 1,
    high: int | None = None,
    capture_options: Mapping[str, object] | None = None,
    run: bool = True,
    on_interrupt: Callable[[], None] | None = None,
    target: str | Device | None = None,
    world_size: int = 1,
    fsdp: FsdpPolicy | None = None,
    offload: Link | str | None = None,
) -> Fit:
    """The largest size whose training step fits `memory` (bytes or "24GiB"; None with a
    `target`: what the target lets PyTorch allocate, `solver.target.Device.usable`: its
    capacity less the process's memory outside PyTorch, an NCCL communicator's included at
    `world_size` > 1 over NCCL).

    `factory(size)` returns ``(model, example_inputs[, example_kwargs])`` at that size (one
    tensor as the one input);
    `loss_fn(output)` is the step's scalar loss, as in `checkpoint_plan` (default
    `default_loss`: ``output.loss``, or the output itself where the forward returns the
    loss). `max_overhead`: the compute cap, a multiple of computing
    every node once (1.3 or "1.3x"; None: unlimited). `optimizer`: "adamw", "sgd" or "none".
    `time_limit`: seconds for the whole call, captures and real steps included (NOTE [one
    deadline]); at the limit the best proven answer comes back with what is open (`stopped`).
    `low`, `high`: the smallest and largest sizes tried (below the first capture size, the
    search starts at the least size whose graph has the captured shape, noted). `run`: run one
    real step at the size found, and eager's steps (each a real allocation of that size on this
    machine). Ctrl-C (from the main thread, where SIGINT has Python's default handler): the
    first ends the fit as the time limit does (`on_interrupt` is called, from another thread),
    a second raises KeyboardInterrupt.
    `target` (estimate mode, docs/estimate.md): the device the fit is for, as
    `graph_capture.capture` takes it; the factory may build on the meta device. No real step
    runs (`run` is then off): the graphs are estimated, and what exists before a step is
    predicted from the shapes (`executor.fitting.memory.predicted_static`).
    `world_size` > 1 (estimate mode only): the fit is per rank under FSDP2, `fully_shard` on
    each of `default_blocks`' blocks and the root, each rank at the size (the local batch or
    sequence): what exists before the step is the FSDP model's resident bytes, and the step's
    budget what `activation_budget` leaves less the unsharded gradients
    (`solver.fitting.fsdp`). `fsdp`: a `solver.target.FsdpPolicy` (NOTE [ one FSDP policy ]
    in executor/fsdp.py; `world_size` may then be left 1), its `rounding` the target's and its
    `optimizer` this fit's (FsdpPolicy's "sgd_momentum" for "sgd"); without it, the policy
    `executor.fsdp_policy` makes for the target with the model's dtype gathered (float32
    master weights, resharded after forward).
    `offload`: a host link (a `solver.Link`, or a name `solver.target.devices.host_link`
    reads: "pcie5", "pcie4", "c2c" or a built-in target's, "h100"): the step's schedules may
    also copy values to host memory and back over it, their cost the compute plus the stall,
    the link's `host_memory` (where set) held (docs/offload.md); `Fit.host_bytes` is what the
    schedule at the answer holds on the host (per rank under FSDP2). None: keep or recompute.

    Raises FitError (which size failed and why; a memory below the parameters, gradients and
    optimizer state; a graph that changes shape with the size; nothing known by the deadline;
    a `time_limit` that is not a positive number of seconds), `solver.target.UnknownTargetError`
    (an unknown target or link name), `solver.core.link.LinkError` (a target without a host
    link) and ValueError (bad arguments).
    """
    if dim not in ("batch", "seq"):
        raise ValueError(f"dim must be 'batch' or 'seq', not {dim!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size!r}")
    try:
        world_size = sharded_world_size(world_size, fsdp)
    except PlanError as e:
        raise FitError(str(e)) from e
    sharded = world_size > 1 or fsdp is not None
    if sharded and target is None:
        raise ValueError(
            f"world_size={world_size} needs estimate mode: pass target= (--target); this machine "
            f"cannot run {world_size} ranks' real steps"
        )
    cap = parse_overhead(max_overhead)
    device = None if target is None else resolve_target(target)  # UnknownTargetError
    link = None if offload is None else host_link(offload)  # UnknownTargetError, LinkError
    wanted = Budget.of(memory)
    if wanted.kind in (PERCENT, LEAST):
        raise ValueError(
            f"memory {memory!r} is device memory: give bytes or units (24GiB), not a "
            "percentage or 'min'"
        )
    policy = None
    if device is not None:
        policy = fsdp if fsdp is not None else fsdp_policy(world_size, device)
    nccl = policy.nccl_communicators if sharded and policy is not None else 0
    memory = wanted.bytes(usable=None if device is None else lambda: device.usable(nccl))
    memory_note = None
    if wanted.kind == USABLE and device is not None:
        memory_note = f"memory: {device.name}'s {device.describe_usable(nccl)}"
    if target is not None:
        capture_options = {**(capture_options or {}), "target": target}
        run = False
    with call_deadline(time_limit, FitError, on_interrupt) as deadline:
        return _fit(
            _Sizes(with_loss(factory, loss_fn), dim, capture_sizes, low, high, capture_options),
            _Step(memory, cap, optimizer, run, world_size, fsdp, sharded, memory_note, link),
            deadline,
        )


@dataclass(frozen=True)
class _Sizes:
    """The sizes a fit searches: `factory(size)` gives the model and inputs at a size, the
    loss attached (`with_loss`); captured with `capture_options` at `capture_sizes` along `dim`
    ("batch" or "seq"); the search spans [`low`, `high`] (None: no upper end given)."""

    factory: Callable[[int], object]
    dim: str
    capture_sizes: Sequence[int]
    low: int
    high: int | None
    capture_options: Mapping[str, object] | None


@dataclass(frozen=True)
class _Step:
    """The training step a fit sizes: `memory` bytes to fit in (`memory_note`: how they were
    derived from the target; None: given), the compute cap `cap` (`parse_overhead`'s form; None:
    unlimited), fit's `optimizer`, `world_size` ranks under FSDP2 with the given policy `fsdp`
    (None: `executor.fsdp.resolve_policy`'s default) where `sharded`, `run`: real steps run on
    this machine, `link`: the host link the schedules may offload over (None: none)."""

    memory: int
    cap: str | None
    optimizer: str
    run: bool
    world_size: int
    fsdp: FsdpPolicy | None
    sharded: bool
    memory_note: str | None
    link: Link | None


@dataclass(frozen=True)
class _StepBytes:
    """The step's bytes at any size: its graph (`graphs`, the same shape from `low` on), what
    exists before it (`static_at(size)`, bytes), the optimizer step's temporaries
    (`optimizer_temporaries`, bytes), per-rank FSDP2 bytes (`sharded`; None: one rank), within
    `memory` bytes; `steps` runs its eager steps."""

    graphs: SizedGraphs
    steps: Steps
    low: int
    static_at: Callable[[int], StaticBytes]
    optimizer_temporaries: int
    sharded: FsdpBytes | None
    memory: int

    def left(self, size: int) -> int:
        """Bytes left to the step at `size`; -1 where the optimizer step's temporaries do not
        fit in them (nothing fits then)."""
        budget = self.memory - self.static_at(size).total
        if self.sharded is not None:
            return self.sharded.step_budget(budget)
        return budget if budget >= self.optimizer_temporaries else -1


def _fit(sizes: _Sizes, step: _Step, deadline: Deadline) -> Fit:
    """`fit` below its argument checks, on its one deadline (NOTE [one deadline]), in order:

    1. `_step_bytes`: the graph at any size and what exists before a step (measured, predicted,
       or per rank under FSDP2), affine in the size
    2. `_search`: the largest size proven to fit and the least proven not to, confirmed on
       captures
    3. `_real_step`: one real step at that size under remat's executor, its measured peak
    4. `_eager`: eager's largest size, measured
    5. `_per_block`: per-block checkpointing's largest size within the cap, predicted

    then the `Fit` of it all, with the notes and warnings each step left.
    """
    begun = time.perf_counter()
    notes = [step.memory_note] if step.memory_note else []
    at = _step_bytes(sizes, step, notes)
    found = _search(at, sizes, step, deadline, notes, begun)
    size = found.size
    measured = measured_host = None
    if step.run and size is not None:
        ran = _real_step(at, size, found.schedule, sizes.dim, deadline, notes)
        measured, measured_host = (None, None) if ran is None else ran
    warnings: list[str] = []
    eager_size = eager_over = None
    if step.run:
        eager_size, eager_over = _eager(at, size, found.upper, sizes.dim, deadline, notes, warnings)
    block_size = _per_block(at, step.cap, sizes.high, size, deadline, notes)
    stopped = "interrupted" if deadline.stopped() else "time limit" if deadline.passed() else None
    return Fit(
        dim=sizes.dim,
        memory=step.memory,
        size=size,
        proven=found.proven,
        upper=found.upper,
        budget=None if size is None else at.left(size),
        schedule=found.schedule,
        static=None if size is None else at.static_at(size),
        optimizer_temporaries=at.optimizer_temporaries,
        measured_peak=measured,
        eager_size=eager_size,
        eager_over=eager_over,
        per_block_size=block_size,
        bytes_model=_bytes_model(at.graphs),
        low=at.low,
        max_overhead=step.cap,
        stopped=stopped,
        seconds=time.perf_counter() - begun,
        notes=notes,
        warnings=warnings,
        probes=found.probes,
        fsdp=at.sharded,
        link=step.link,
        measured_host_peak=measured_host,
    )


def _step_bytes(sizes: _Sizes, step: _Step, notes: list[str]) -> _StepBytes:
    """The step's graphs (`SizedGraphs`, from the least size whose graph has the captured shape)
    and what exists before it at each captured size (`_statics`; per rank under FSDP2,
    `_per_rank`), made affine in the size (`_static_at`); what was assumed goes to `notes`."""
    graphs = SizedGraphs(sizes.factory, sizes.capture_sizes, sizes.dim, sizes.capture_options)
    low, note = graphs.stable_from(sizes.low)
    if note:
        notes.append(note)
    steps = Steps(graphs, step.optimizer)
    statics, temporaries = _statics(graphs, steps, sizes.capture_sizes, step.optimizer)
    sharded = None
    if step.sharded:
        sharded = _per_rank(graphs, sizes, step)
        statics = {s: sharded.static(st.buffers, st.inputs) for s, st in statics.items()}
        temporaries = sharded.memory.optimizer_temporaries
        notes.append(
            f"FSDP2 over {step.world_size} ranks: the {sizes.dim} is each rank's; "
            "bytes per rank (rank 0)"
        )
    if "target" in graphs.options:
        name = graphs.captures[sizes.capture_sizes[0]].graph.dag.graph["target"]
        notes.append(f"estimate mode for target {name!r}: bytes predicted, no real step run")
    static_at = _static_at(statics, step.memory, graphs, sizes)
    return _StepBytes(graphs, steps, low, static_at, temporaries, sharded, step.memory)


def _per_rank(graphs: SizedGraphs, sizes: _Sizes, step: _Step) -> FsdpBytes:
    """Rank 0's FSDP2 bytes for the model at the first capture size (estimate mode: the
    target's allocator rounding)."""
    device = resolve_target(graphs.options["target"])
    model, inputs, kwargs = graphs.captures[sizes.capture_sizes[0]].made
    optimizer = FSDP_OPTIMIZERS[step.optimizer]
    try:
        policy = resolve_policy(model, step.world_size, step.fsdp, device, optimizer)
    except PlanError as e:
        raise FitError(str(e)) from e
    return fsdp_bytes(model, inputs, kwargs, policy)


def _static_at(
    statics: dict[int, StaticBytes], memory: int, graphs: SizedGraphs, sizes: _Sizes
) -> Callable[[int], StaticBytes]:
    """What exists before a step at any size (bytes), affine between the captured sizes'
    `statics`. FitError where `memory` (bytes) is below the model's own bytes, where those bytes
    are not affine in the size, or where nothing of the step grows with the size."""
    first = statics[sizes.capture_sizes[0]]
    if memory < first.model:
        raise FitError(
            f"memory {memory} B is below the {first.model} B that the parameters "
            f"({first.parameters} B), their gradients ({first.gradients} B), the optimizer state "
            f"({first.optimizer_state} B) and buffers ({first.buffers} B) take alone"
        )
    try:
        static_at = affine_static(statics)
    except StaticBytesError as e:
        raise FitError(str(e)) from e
    ends = sizes.capture_sizes[0], sizes.capture_sizes[-1]
    if graphs.flat() and static_at(ends[0]).total == static_at(ends[1]).total:
        shown = ", ".join(map(str, sizes.capture_sizes))
        raise FitError(
            f"no byte of the step changes with the {sizes.dim} across the captured sizes {shown} "
            "(the target's allocator rounding can hide small tensors' growth): nothing bounds "
            "the size; capture at larger sizes (fit's capture_sizes=...)"
        )
    return static_at


def _search(
    at: _StepBytes,
    sizes: _Sizes,
    step: _Step,
    deadline: Deadline,
    notes: list[str],
    begun: float,
) -> FitResult:
    """The largest size whose least peak within the step's cap fits the bytes left to the step
    (`largest_fitting`, on `SEARCH_SHARE` of the time left, offloading over the step's link
    where it has one), confirmed on captures
    (`confirmed`: a second search where a capture refutes the prediction); a capture starts
    only where the deadline leaves it time. FitError where the deadline passed before any size
    was decided (`begun`: the fit's start, `time.perf_counter` seconds)."""

    def graph_at(size: int) -> nx.DiGraph | None:
        captures = size not in at.graphs.captures and not at.graphs.affine
        if captures and not deadline.leaves(at.graphs.expected_seconds(size)):
            return None  # no time for the capture: the search ends as at its deadline
        return at.graphs(size)

    def search() -> FitResult:
        share = deadline.share(SEARCH_SHARE)
        return largest_fitting(
            graph_at,
            at.left,
            compute_budget=step.cap,
            low=at.low,
            high=sizes.high,
            deadline=share,
            offload=step.link,
        )

    found = confirmed(search, at.graphs, sizes.dim, at.low, deadline, notes)
    if found.size is None and found.upper is None and deadline.passed():
        why = "interrupted" if deadline.stopped() else "the time limit passed"
        raise FitError(
            f"{why} before any {sizes.dim} was decided on a capture "
            f"({time.perf_counter() - begun:.1f} s); "
            "nothing is known yet: raise the time limit (--time-limit)"
        )
    return found


def _real_step(
    at: _StepBytes,
    size: int,
    schedule: Schedule | None,
    dim: str,
    deadline: Deadline,
    notes: list[str],
) -> tuple[int, int | None] | None:
    """One real step at `size` under `schedule` (`run_step`): its measured whole-step peak and
    host copies' peak in bytes; None (noted) where the deadline leaves no time for it."""
    needs = at.graphs.expected_seconds(size) + at.steps.expected_seconds()
    if deadline.leaves(needs):
        return run_step(at.steps, size, schedule)
    notes.append(f"one real step at {dim} {size}: not run by the deadline")
    return None


def _eager(
    at: _StepBytes,
    size: int | None,
    upper: int | None,
    dim: str,
    deadline: Deadline,
    notes: list[str],
    warnings: list[str],
) -> tuple[int | None, int | None]:
    """Eager's largest size up to one above the fit's `size` (`eager`, measured steps) and its
    measured whole-step peak one size above that (bytes); a bisection cut short goes to `notes`,
    an eager step that fits above `size` to `notes` or `warnings` (`eager_above`; `upper`: the
    least size proven not to fit)."""
    above = (size or at.low - 1) + 1
    found = eager(at.steps, at.memory, at.low, above, deadline)
    if not found.complete and found.size != above:
        notes.append(cut_short("eager's bisection", found.size))
    if found.size is not None and found.size > above - 1:
        eager_above(dim, found.size, found.peak, at.memory, upper, notes, warnings)
    return found.size, found.over


def _per_block(
    at: _StepBytes,
    cap: str | None,
    high: int | None,
    size: int | None,
    deadline: Deadline,
    notes: list[str],
) -> int | None:
    """Per-block checkpointing's largest size within `cap` in the bytes left to the step
    (`per_block`, predicted), searched up to `high` (None: twice the fit's `size`); a bisection
    cut short goes to `notes`."""
    block_size, complete = per_block(
        at.graphs, at.left, cap, at.low, high or 2 * (size or at.low), deadline
    )
    if not complete:
        notes.append(cut_short("per-block checkpointing's bisection", block_size))
    return block_size


def _statics(
    graphs: SizedGraphs, steps: Steps, sizes: Sequence[int], optimizer: str
) -> tuple[dict[int, StaticBytes], int]:
    """What exists before a step at each captured size, and the optimizer step's temporaries:
    measured after one real step, or predicted from the shapes in estimate mode."""
    if "target" not in graphs.options:
        prepared = {s: steps.prepare(s) for s in sizes}
        temporaries = prepared[sizes[0]][0].optimizer_temporaries()
        return {s: static for s, (_, static) in prepared.items()}, temporaries
    rounding = resolve_target(graphs.options["target"]).rounding
    predicted = {s: predicted_static(*graphs.captures[s].made, optimizer, rounding) for s in sizes}
    return {s: static for s, (static, _) in predicted.items()}, predicted[sizes[0]][1]


def _bytes_model(graphs: SizedGraphs) -> str:
    sizes = ", ".join(map(str, graphs.sizes))
    if graphs.affine:
        return (
            f"affine in the {graphs.dim}, checked node by node at {sizes}; "
            "captured at the answer and the answer + 1, where they match the prediction"
        )
    shown = "; ".join(graphs.not_affine[:3])
    return f"not affine ({shown}; ...): captured at every size probed"
