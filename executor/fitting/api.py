"""`fit`: the largest batch (or sequence length) whose training step fits a device's memory,
proven in the solver's model and run, all within one deadline (NOTE [one deadline] in
executor/fitting/search.py).

    fit(factory, "24GiB", dim="batch", compute_budget=1.3, optimizer="adamw", time_limit=60,
        offload=None)
      SizedGraphs(factory, capture_sizes)   the DAG at any size: captures, affine between them;
                                            `stable_from` skips small sizes whose graph differs
      EagerSteps.prepare                    what exists before a step, measured (StaticBytes)
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

`fit` checks its arguments and resolves the memory, target, host link and FSDP2 policy they
name; `executor.fitting.search.fit_sizes` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from executor.errors import FitError, PlanError
from executor.fitting.graphs import with_loss
from executor.fitting.memory import OPTIMIZERS
from executor.fitting.search import fit_sizes
from executor.fitting.step_bytes import Sizes, StepSetup
from executor.fsdp import fsdp_policy, sharded_world_size
from executor.loss import default_loss
from graph_capture.measurement.roofline import resolve_target
from solver.core.budget import LEAST, PERCENT, USABLE, Budget, parse_overhead
from solver.core.link import Link
from solver.fitting.result import Fit
from solver.interrupt import call_deadline
from solver.spelling import spelled
from solver.target import Device, FsdpPolicy
from solver.target.devices import host_link


@spelled
def fit(
    factory: Callable[[int], object],
    budget: int | str | None,
    *,
    dim: str = "batch",
    compute_budget: float | str | None = None,
    optimizer: str = "adamw",
    time_limit: float = 60.0,
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
    """The largest size whose training step fits `budget` (bytes or "24GiB"; None with a
    `target`: what the target lets PyTorch allocate, `solver.target.Device.usable`: its
    capacity less the process's memory outside PyTorch, an NCCL communicator's included at
    `world_size` > 1 over NCCL).

    `factory(size)` returns ``(model, example_inputs[, example_kwargs])`` at that size (one
    tensor as the one input);
    `loss_fn(output)` is the step's scalar loss, as in `checkpoint_plan` (default
    `default_loss`: ``output.loss``, or the output itself where the forward returns the
    loss). `compute_budget`: the compute cap, a multiple of computing
    every node once (1.3 or "1.3x"; None: unlimited). `optimizer`: "adamw", "sgd" or "none".
    `time_limit`: seconds for the whole call, captures and real steps included (NOTE [one
    deadline] in executor/fitting/search.py); at the limit the best proven answer comes back
    with what is open (`stopped`).
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
    the link's `host_memory` (where set) held (docs/offload.md); `Fit.host_peak` is what the
    schedule at the answer holds on the host (per rank under FSDP2). None: keep or recompute.

    Raises FitError (which size failed and why; a memory below the parameters, gradients and
    optimizer state; a graph that changes shape with the size; nothing known by the deadline;
    a `time_limit` that is not a positive number of seconds; an argument it cannot take),
    `solver.BudgetError` (a `budget` or `compute_budget` that cannot be read),
    `solver.UnknownTargetError` (an unknown target or link name) and `solver.LinkError` (a
    target without a host link).

    Exception to the 8-parameter and 80-line rules: a public entry point whose keyword-only
    parameters are the one interface's options, each documented here.
    """
    world_size, sharded = _ranks(dim, optimizer, world_size, fsdp, target)
    cap = parse_overhead(compute_budget)
    device = None if target is None else resolve_target(target)  # UnknownTargetError
    link = None if offload is None else host_link(offload)  # UnknownTargetError, LinkError
    memory, memory_note = _memory(budget, device, fsdp, world_size, sharded)
    if target is not None:
        capture_options = {**(capture_options or {}), "target": target}
        run = False
    with call_deadline(time_limit, FitError, on_interrupt) as deadline:
        return fit_sizes(
            Sizes(with_loss(factory, loss_fn), dim, capture_sizes, low, high, capture_options),
            StepSetup(
                memory=memory,
                cap=cap,
                optimizer=optimizer,
                run=run,
                world_size=world_size,
                fsdp=fsdp,
                sharded=sharded,
                memory_note=memory_note,
                link=link,
            ),
            deadline,
        )


def _ranks(
    dim: str, optimizer: str, world_size: int, fsdp: FsdpPolicy | None, target: object
) -> tuple[int, bool]:
    """(the world size, whether the step is sharded under FSDP2): `fit`'s arguments checked
    (FitError where one cannot be taken)."""
    if dim not in ("batch", "seq"):
        raise FitError(f"dim must be 'batch' or 'seq', not {dim!r}")
    if optimizer not in OPTIMIZERS:
        raise FitError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if world_size < 1:
        raise FitError(f"world_size must be at least 1, not {world_size!r}")
    try:
        world_size = sharded_world_size(world_size, fsdp)
    except PlanError as e:
        raise FitError(str(e)) from e
    sharded = world_size > 1 or fsdp is not None
    if sharded and target is None:
        raise FitError(
            f"world_size={world_size} needs estimate mode: pass target= (--target); this machine "
            f"cannot run {world_size} ranks' real steps"
        )
    return world_size, sharded


def _memory(
    budget: int | str | None,
    device: Device | None,
    fsdp: FsdpPolicy | None,
    world_size: int,
    sharded: bool,
) -> tuple[int, str | None]:
    """(bytes the step fits in, how they were derived from the target; None: given): `budget`
    read, on `device` where it names the device's usable memory (less the NCCL communicators
    of the FSDP2 policy where `sharded`)."""
    wanted = Budget.of(budget)
    if wanted.kind in (PERCENT, LEAST):
        raise FitError(
            f"budget {budget!r} is device memory: give bytes or units (24GiB), not a "
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
    return memory, memory_note
