"""`fit`: the largest batch (or sequence length) whose training step fits a device's memory,
proven in the solver's model and run, all within one deadline.

    fit(factory, "24GiB", dim="batch", max_overhead=1.3, optimizer="adamw", time_limit=60)
      SizedGraphs(factory, capture_sizes)   the DAG at any size: captures, affine between them;
                                            `stable_from` skips small sizes whose graph differs
      Steps.prepare                         what exists before a step, measured (StaticBytes)
      solver.fit.largest_fitting            the largest size whose least peak within the cap
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
from dataclasses import dataclass, field

import networkx as nx
import torch

import solver
from executor.errors import FitError
from executor.fitting.baselines import Steps, eager, per_block, run_step
from executor.fitting.graphs import SizedGraphs, with_loss
from executor.fitting.memory import OPTIMIZERS, StaticBytes, predicted_static
from executor.loss import default_loss
from graph_capture.measurement.roofline import resolve_target
from solver.core.budget import human_bytes, parse_budget
from solver.deadline import Deadline, Stop
from solver.fit import DOES_NOT_FIT, FITS, FitResult, Probe, largest_fitting
from solver.interrupt import first_sigint_stops
from solver.sizes import affine
from solver.target import Device

RUNTIME = "remat's executor (executor.Rematerialized)"

SEARCH_SHARE = 0.6
"""The share of the time left that a search gets; the rest is for the confirming captures, the
real steps and the baselines (and, where a capture refutes the prediction, the second search)."""


@dataclass
class Fit:
    """What `fit` found. Sizes are in `dim` units; bytes are whole-step bytes unless named.

    `size`: the largest size proven to fit (None: none was); `proven`: the size after it (or
    `low`) is proven not to fit; `upper`: the least size proven not to fit (None: none was; the
    sizes between are open); `low`: where the search started; `budget`: the step's byte budget
    at `size` as `rematerialize` takes it (the memory less `static`); `schedule`: the schedule
    at `size`; `measured_peak`: one real step's whole-step peak at `size` under `runtime`;
    `eager_size`, `eager_over`: eager's largest size, measured, and the measured whole-step
    peak at eager_size + 1; `per_block_size`: per-block `torch.utils.checkpoint`'s largest size
    within the cap, as the solver predicts it; `bytes_model`: how the bytes at each size were
    obtained; `stopped`: "time limit" or "interrupted" where the call ended on its deadline
    (None: it finished); `seconds`: its wall time; `notes`: what was skipped or not done;
    `warnings`: measurements that contradict the proof; `probes`: the solver's probes."""

    dim: str
    memory: int
    size: int | None
    proven: bool
    upper: int | None
    budget: int | None
    schedule: solver.Schedule | None
    static: StaticBytes | None
    optimizer_temporaries: int
    measured_peak: int | None
    eager_size: int | None
    eager_over: int | None
    per_block_size: int | None
    bytes_model: str
    low: int = 1
    max_overhead: str | None = None
    stopped: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    runtime: str = RUNTIME
    probes: list[Probe] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        """The result as lines for a terminal."""
        d = self.dim
        lines = [self._head(), f"bytes: {self.bytes_model}"]
        if self.stopped is not None:
            lines.append(
                f"{'interrupted' if self.stopped == 'interrupted' else 'the time limit passed'}"
                f" at {self.seconds:.1f} s: what follows is what was known then"
            )
        if self.static is not None and self.size is not None:
            s = self.static
            lines.append(
                f"before the step at {d} {self.size}: parameters {s.parameters} B, gradients "
                f"{s.gradients} B, optimizer state {s.optimizer_state} B, buffers {s.buffers} B, "
                f"inputs {s.inputs} B; step budget {self.budget} B; optimizer step temporaries "
                f"{self.optimizer_temporaries} B"
            )
        if self.schedule is not None:
            lines.append(
                f"schedule at {d} {self.size}: peak {self.schedule.peak} B, cost "
                f"{self.schedule.cost:.6g} s ({self.schedule.status})"
            )
        if self.measured_peak is not None:
            verdict = "within" if self.measured_peak <= self.memory else "OVER"
            lines.append(
                f"one real step at {d} {self.size} under {self.runtime}: whole-step peak "
                f"{self.measured_peak} B, {verdict} {self.memory} B"
            )
        if self.eager_size is not None or self.eager_over is not None:
            over = "" if self.eager_over is None else f"; measured {self.eager_over} B at +1"
            lines.append(f"eager: largest {d} {self.eager_size}{over}")
        cap = "unlimited compute" if self.max_overhead is None else f"within {self.max_overhead}"
        lines.append(f"per-block checkpoint (predicted, {cap}): largest {d} {self.per_block_size}")
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _head(self) -> str:
        d, memory = self.dim, human_bytes(self.memory)
        if self.size is None:
            if self.proven:
                return f"no {d} fits in {memory} ({d} {self.low} proven not to fit)"
            return f"no {d} shown to fit in {memory} ({self._open(self.low)})"
        if self.proven:
            return f"largest {d}: {self.size} ({d} {self.size + 1} proven not to fit)"
        return f"largest {d} proven: {self.size} ({self._open(self.size + 1)})"

    def _open(self, first: int) -> str:
        d = self.dim
        if self.upper is None:
            return f"{d} {first} and above open"
        return f"{d} {first}..{self.upper - 1} open, {self.upper} proven not to fit"


def fit(
    factory: Callable[[int], object],
    memory: int | str,
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
) -> Fit:
    """The largest size whose training step fits `memory` (bytes or "24GiB").

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
    cap = _overhead(max_overhead)
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
) -> Fit:
    begun = time.perf_counter()
    graphs = SizedGraphs(factory, capture_sizes, dim, capture_options)
    low, note = graphs.stable_from(low)
    notes = [note] if note else []
    steps = Steps(graphs, optimizer)
    statics, opt_temp = _statics(graphs, steps, capture_sizes, optimizer)
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
    static_at = _affine_static(statics)

    def left(size: int) -> int:
        """Bytes left to the step at `size`; -1 where the optimizer step's temporaries do not
        fit in them (nothing fits then)."""
        budget = memory - static_at(size).total
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

    found = search()
    captured = {p.size for p in found.probes if p.size in graphs.captures}
    for size in (found.size, found.upper):
        if not graphs.affine or size is None or size in captured:
            continue
        if not deadline.leaves(graphs.expected_seconds(size)):
            notes.append(
                f"{dim} {size} was decided on the affine prediction and not captured by the "
                "deadline: it is not counted"
            )
            continue
        if graphs.refute(size):  # the prediction is wrong there: no answer rests on it
            notes.append(
                f"the capture at {dim} {size} differs from the affine prediction: searched "
                "again over captures"
            )
            found = search()
            captured = {p.size for p in found.probes}
            break
        captured.add(size)  # the capture is the predicted graph: the probe's proof holds on it
    probes = [p for p in found.probes if p.size in captured]
    size = max((p.size for p in probes if p.verdict == FITS), default=None)
    upper = min(
        (p.size for p in probes if p.verdict == DOES_NOT_FIT and p.size > (size or 0)), default=None
    )
    if size is None and upper is None and deadline.passed():
        why = "interrupted" if deadline.stopped() else "the time limit passed"
        raise FitError(
            f"{why} before any {dim} was decided on a capture "
            f"({time.perf_counter() - begun:.1f} s); "
            "nothing is known yet: raise the time limit (--time-limit)"
        )
    proven = upper is not None and upper == (low if size is None else size + 1)
    schedule = None if size is None else next(p.schedule for p in probes if p.size == size)
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
            notes.append(_cut_short("eager's bisection", eager_size))
        if eager_size is not None and eager_size > (size or low - 1):
            _eager_above(dim, eager_size, found_eager.peak, memory, upper, notes, warnings)
    block_size, complete = per_block(graphs, left, cap, low, high or 2 * (size or low), deadline)
    if not complete:
        notes.append(_cut_short("per-block checkpointing's bisection", block_size))
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


def _cut_short(what: str, largest: int | None) -> str:
    shown = "" if largest is None else f"; the largest shown to fit: {largest}"
    return f"{what} was cut short by the deadline{shown}"


def _eager_above(
    dim: str,
    eager_size: int,
    peak: int | None,
    memory: int,
    upper: int | None,
    notes: list[str],
    warnings: list[str],
) -> None:
    """Eager measured within the memory at `eager_size`, above remat's answer: a warning where
    the solver proved that size does not fit (its bytes then overstate this step's), a note
    where it was open."""
    fact = f"eager trains at {dim} {eager_size} (measured {peak} B within {memory} B)"
    if upper is not None and eager_size >= upper:
        warnings.append(
            f"{fact}, which the proof says does not fit: the captured bytes overstate this "
            "step's (compare the graph's bytes with the measured ones); the answer is not the "
            "largest"
        )
    else:
        notes.append(f"{fact}, a size the search left open: larger sizes were not tried")


def _overhead(max_overhead: float | str | None) -> str | None:
    """The compute cap as solver text ("1.3x"); ValueError below 1.0."""
    if max_overhead is None:
        return None
    text = str(max_overhead).strip().lower().removesuffix("x")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"max overhead {max_overhead!r} is not a number like 1.3 or 1.3x"
        ) from None
    if not value >= 1.0:
        raise ValueError(
            f"max overhead {max_overhead!r} is below 1.0: a step computes every node at least "
            "once (1.0x is no recomputation; 1.3x allows 30% more)"
        )
    return f"{value}x"


def _memory_bytes(memory: int | str) -> int:
    if isinstance(memory, str) and "%" in memory:
        raise ValueError(f"memory {memory!r}: give bytes or units (24GiB), not a percentage")
    return parse_budget(memory, None)  # type: ignore[arg-type]  # no problem needed without %


def _affine_static(statics: dict[int, StaticBytes]) -> Callable[[int], StaticBytes]:
    """The bytes before a step at any size: the model's the same at every captured size, the
    inputs' affine (FitError otherwise)."""
    base = statics[min(statics)]
    inputs = affine({s: static.inputs for s, static in statics.items()})
    if inputs is None or any(static.model != base.model for static in statics.values()):
        raise FitError(
            f"the bytes before a step are not the model's plus inputs affine in the size: "
            f"{statics}; remat fit needs parameters that do not change with the size"
        )

    def at(size: int) -> StaticBytes:
        return StaticBytes(
            base.parameters, base.gradients, base.optimizer_state, base.buffers, inputs(size)
        )

    return at


def _bytes_model(graphs: SizedGraphs) -> str:
    sizes = ", ".join(map(str, graphs.sizes))
    if graphs.affine:
        return (
            f"affine in the {graphs.dim}, checked node by node at {sizes}; "
            "captured at the answer and the answer + 1, where they match the prediction"
        )
    shown = "; ".join(graphs.not_affine[:3])
    return f"not affine ({shown}; ...): captured at every size probed"
