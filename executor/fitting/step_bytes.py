"""The training step a fit sizes and its bytes at any size: `Sizes` (the sizes searched),
`StepSetup` (the memory, compute cap, optimizer, ranks and host link the step is sized for) and
`step_bytes`, the step's graph at any size and what exists before it, affine in the size
(`StepBytes`).

Memory as the device counts it (`executor.fitting.memory`): parameters, gradients, optimizer state
(after one real step), buffers and inputs exist before the step; the step's budget is the memory
less those, and the optimizer step's own temporaries must fit in it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from executor.errors import FitError, PlanError
from executor.fitting.baselines import EagerSteps
from executor.fitting.fsdp import fsdp_bytes
from executor.fitting.graphs import SizedGraphs
from executor.fitting.memory import FSDP_OPTIMIZERS, predicted_static
from executor.fsdp import resolve_policy
from graph_capture.measurement.roofline import resolve_target
from solver.core.link import Link
from solver.fitting.fsdp import FsdpBytes
from solver.fitting.static import StaticBytes, StaticBytesError, affine_static
from solver.target import FsdpPolicy


@dataclass(frozen=True)
class Sizes:
    """The sizes a fit searches: `factory(size)` gives the model and inputs at a size, the
    loss attached (`with_loss`); captured with `capture_options` at `capture_sizes` along `dim`
    ("batch" or "seq"); the search spans [`low`, `high`] (None: no upper end given)."""

    factory: Callable[[int], object]
    dim: str
    capture_sizes: Sequence[int]
    low: int
    high: int | None
    capture_options: Mapping[str, object] | None


@dataclass(frozen=True, kw_only=True)
class StepSetup:
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
class StepBytes:
    """The step's bytes at any size: its graph (`graphs`, the same shape from `low` on), what
    exists before it (`static_at(size)`, bytes), the optimizer step's temporaries
    (`optimizer_temporaries`, bytes), per-rank FSDP2 bytes (`sharded`; None: one rank), within
    `memory` bytes; `steps` runs its eager steps."""

    graphs: SizedGraphs
    steps: EagerSteps
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


def step_bytes(sizes: Sizes, step: StepSetup, notes: list[str]) -> StepBytes:
    """The step's graphs (`SizedGraphs`, from the least size whose graph has the captured shape)
    and what exists before it at each captured size (`_statics`; per rank under FSDP2,
    `_per_rank`), made affine in the size (`_static_at`); what was assumed goes to `notes`."""
    graphs = SizedGraphs(sizes.factory, sizes.capture_sizes, sizes.dim, sizes.capture_options)
    low, note = graphs.stable_from(sizes.low)
    if note:
        notes.append(note)
    steps = EagerSteps(graphs, step.optimizer)
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
    return StepBytes(graphs, steps, low, static_at, temporaries, sharded, step.memory)


def _per_rank(graphs: SizedGraphs, sizes: Sizes, step: StepSetup) -> FsdpBytes:
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
    statics: dict[int, StaticBytes], memory: int, graphs: SizedGraphs, sizes: Sizes
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


def _statics(
    graphs: SizedGraphs, steps: EagerSteps, sizes: Sequence[int], optimizer: str
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
