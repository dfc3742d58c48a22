"""`fit`: the largest batch (or sequence length) whose training step fits a device's memory,
proven in the solver's model and run, all within one deadline.

    fit(factory, "24GiB", dim="batch", max_overhead=1.3, optimizer="adamw", time_limit=60)
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
from solver.core.budget import parse_budget, parse_overhead
from solver.deadline import Deadline, Stop
from solver.fitting.result import (
    Fit,
    StaticBytes,
    StaticBytesError,
    affine_static,
    cut_short,
    eager_above,
)
from solver.fitting.search import FitResult, confirmed, largest_fitting
from solver.interrupt import first_sigint_stops
from solver.target import Device, FsdpPolicy

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
) -> Fit:
    """The largest size whose training step fits `memory` (bytes or "24GiB"; None with a
    `target`: what the target lets PyTorch allocate, `solver.target.Device.usable`: its
    capacity less the process's memory outside PyTorch, an NCCL communicator's included at
    `world_size` > 1 over NCCL).

    `factory(size)` returns ``(model, example_inputs[, example_kwargs])`` at that size;
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

    Raises FitError (which size failed and why; a memory below the parameters, gradients and
    optimizer state; a graph that changes shape with the size; nothing known by the deadline)
    and ValueError (bad arguments).
    """
    if dim not in ("batch", "seq"):
        raise ValueError(f"dim must be 'batch' or 'seq', not {dim!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if not time_limit > 0:
        raise ValueError(f"time_limit must be a positive number of seconds, not {time_limit!r}")
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
    memory_note = None
    if memory is None:
        if target is None:
            raise ValueError("memory=None needs a target (the device whose usable memory it is)")
        device = resolve_target(target)
        policy = fsdp if fsdp is not None else fsdp_policy(world_size, device)
        nccl = policy.nccl_communicators if sharded else 0
        memory = device.usable(nccl)
        memory_note = f"memory: {device.name}'s {device.describe_usable(nccl)}"
    memory = _memory_bytes(memory)
    stop = Stop()
    deadline = Deadline.after(time_limit, stop)
    if target is not None:
        capture_options = {**(capture_options or {}), "target": target}
        run = False
    with first_sigint_stops(stop, on_interrupt):
        return _fit(
            with_loss(factory, loss_fn),
            memory,
            dim,
            cap,
            optimizer,
            deadline,
            capture_sizes,
            low,
            high,
            capture_options,
            run,
            (world_size, fsdp) if sharded else None,
            memory_note,
        )


def _fit(
    factory: Callable[[int], object],
    memory: int,
    dim: str,
    cap: str | None,
    optimizer: str,
    deadline: Deadline,
    capture_sizes: Sequence[int],
    low: int,
    high: int | None,
    capture_options: Mapping[str, object] | None,
    run: bool,
    sharding: tuple[int, FsdpPolicy | None] | None = None,
    memory_note: str | None = None,
) -> Fit:
    """`fit` within its deadline; `sharding`: FSDP2's world size and the given policy (None:
    unsharded)."""
    begun = time.perf_counter()
    graphs = SizedGraphs(factory, capture_sizes, dim, capture_options)
    low, note = graphs.stable_from(low)
    notes = [n for n in (memory_note, note) if n]
    steps = Steps(graphs, optimizer)
    statics, opt_temp = _statics(graphs, steps, capture_sizes, optimizer)
    sharded = None
    if sharding is not None:
        world_size, given = sharding
        device = resolve_target(graphs.options["target"])
        model, inputs, kwargs = graphs.captures[capture_sizes[0]].made
        try:
            policy = resolve_policy(model, world_size, given, device, FSDP_OPTIMIZERS[optimizer])
        except PlanError as e:
            raise FitError(str(e)) from e
        sharded = fsdp_bytes(model, inputs, kwargs, policy)
        statics = {s: sharded.static(st.buffers, st.inputs) for s, st in statics.items()}
        opt_temp = sharded.memory.optimizer_temporaries
        notes.append(
            f"FSDP2 over {world_size} ranks: the {dim} is each rank's; bytes per rank (rank 0)"
        )
    first = statics[capture_sizes[0]]
    if "target" in graphs.options:
        name = graphs.captures[capture_sizes[0]].graph.dag.graph["target"]
        notes.append(f"estimate mode for target {name!r}: bytes predicted, no real step run")
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
    if graphs.flat() and static_at(capture_sizes[0]).total == static_at(capture_sizes[-1]).total:
        sizes = ", ".join(map(str, capture_sizes))
        raise FitError(
            f"no byte of the step changes with the {dim} across the captured sizes {sizes} "
            "(the target's allocator rounding can hide small tensors' growth): nothing bounds "
            "the size; capture at larger sizes (fit's capture_sizes=...)"
        )

    def left(size: int) -> int:
        """Bytes left to the step at `size`; -1 where the optimizer step's temporaries do not
        fit in them (nothing fits then)."""
        budget = memory - static_at(size).total
        if sharded is not None:
            return sharded.step_budget(budget)
        return budget if budget >= opt_temp else -1

    def graph_at(size: int) -> nx.DiGraph | None:
        captures = size not in graphs.captures and not graphs.affine
        if captures and not deadline.leaves(graphs.expected_seconds(size)):
            return None  # no time for the capture: the search ends as at its deadline
        return graphs(size)

    def search() -> FitResult:
        share = deadline.share(SEARCH_SHARE)
        return largest_fitting(
            graph_at, left, compute_budget=cap, low=low, high=high, deadline=share
        )

    found = confirmed(search, graphs, dim, low, deadline, notes)
    size, upper, proven, schedule = found.size, found.upper, found.proven, found.schedule
    if size is None and upper is None and deadline.passed():
        why = "interrupted" if deadline.stopped() else "the time limit passed"
        raise FitError(
            f"{why} before any {dim} was decided on a capture "
            f"({time.perf_counter() - begun:.1f} s); "
            "nothing is known yet: raise the time limit (--time-limit)"
        )
    measured = None
    if run and size is not None:
        needs = graphs.expected_seconds(size) + steps.expected_seconds()
        if deadline.leaves(needs):
            measured = run_step(steps, size, schedule)
        else:
            notes.append(f"one real step at {dim} {size}: not run by the deadline")
    warnings: list[str] = []
    eager_size = eager_over = None
    if run:
        found_eager = eager(steps, memory, low, (size or low - 1) + 1, deadline)
        eager_size, eager_over = found_eager.size, found_eager.over
        if not found_eager.complete and found_eager.size != (size or low - 1) + 1:
            notes.append(cut_short("eager's bisection", eager_size))
        if eager_size is not None and eager_size > (size or low - 1):
            eager_above(dim, eager_size, found_eager.peak, memory, upper, notes, warnings)
    block_size, complete = per_block(graphs, left, cap, low, high or 2 * (size or low), deadline)
    if not complete:
        notes.append(cut_short("per-block checkpointing's bisection", block_size))
    stopped = "interrupted" if deadline.stopped() else "time limit" if deadline.passed() else None
    return Fit(
        dim=dim,
        memory=memory,
        size=size,
        proven=proven,
        upper=upper,
        budget=None if size is None else left(size),
        schedule=schedule,
        static=None if size is None else static_at(size),
        optimizer_temporaries=opt_temp,
        measured_peak=measured,
        eager_size=eager_size,
        eager_over=eager_over,
        per_block_size=block_size,
        bytes_model=_bytes_model(graphs),
        low=low,
        max_overhead=cap,
        stopped=stopped,
        seconds=time.perf_counter() - begun,
        notes=notes,
        warnings=warnings,
        probes=found.probes,
        fsdp=sharded,
    )


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


def _memory_bytes(memory: int | str) -> int:
    if isinstance(memory, str) and "%" in memory:
        raise ValueError(f"memory {memory!r}: give bytes or units (24GiB), not a percentage")
    return parse_budget(memory, None)  # type: ignore[arg-type]  # no problem needed without %


def _bytes_model(graphs: SizedGraphs) -> str:
    sizes = ", ".join(map(str, graphs.sizes))
    if graphs.affine:
        return (
            f"affine in the {graphs.dim}, checked node by node at {sizes}; "
            "captured at the answer and the answer + 1, where they match the prediction"
        )
    shown = "; ".join(graphs.not_affine[:3])
    return f"not affine ({shown}; ...): captured at every size probed"
