"""`fit`: the largest batch (or sequence length) whose training step fits a device's memory,
proven in the solver's model and run.

    fit(factory, "24GiB", dim="batch", max_overhead=1.3, optimizer="adamw", time_limit=60)
      SizedGraphs(factory, capture_sizes)   the DAG at any size: captures, affine between them
      TrainingStep.prepare                  what exists before a step, measured (StaticBytes)
      solver.fit.largest_fitting            the largest size whose least peak within the cap
                                            fits the memory left to the step, proof at size + 1
                                            (again on captures at every size, where the
                                            capture at the answer or + 1 refutes the affine
                                            prediction)
      _confirm                              capture at size and size + 1: the prediction is
                                            checked there, both proofs redone on the captures
      _run                                  one real step at the size under remat's executor:
                                            the measured whole-step peak against the memory
      _eager_size                           the largest size eager trains in, measured, with
                                            its size + 1 measured over
      _per_block_size                       per-block checkpointing's largest size (predicted)

Memory as the device counts it (`executor.fit_memory`): parameters, gradients, optimizer state
(after one real step), buffers and inputs exist before the step; the step's budget is the memory
less those, and the optimizer step's own temporaries must fit in it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx

import solver
from executor.errors import FitError
from executor.fit_graphs import SizedGraphs, build
from executor.fit_memory import OPTIMIZERS, StaticBytes, TrainingStep
from executor.module import Rematerialized
from solver.core.budget import human_bytes, parse_budget
from solver.fit import DOES_NOT_FIT, FITS, FitResult, Probe, largest_fitting, probe
from solver.heuristics.baselines import block_checkpoint

RUNTIME = "remat's executor (executor.Rematerialized)"


@dataclass
class Fit:
    """What `fit` found. Sizes are in `dim` units; bytes are whole-step bytes unless named.

    `size`: the largest size that fits (None: not even 1); `proven`: size + 1 is proven not to
    fit (on its capture); `upper`: the least size proven not to fit; `budget`: the step's byte
    budget at `size` as `rematerialize` takes it (the memory less `static`); `schedule`: the
    schedule at `size`; `measured_peak`: one real step's whole-step peak at `size` under
    `runtime`; `eager_size`, `eager_over`: eager's largest size, measured, and the measured
    whole-step peak at eager_size + 1; `per_block_size`: per-block `torch.utils.checkpoint`'s
    largest size as the solver predicts it; `bytes_model`: how the bytes at each size were
    obtained; `probes`: the solver's probes."""

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
    runtime: str = RUNTIME
    probes: list[Probe] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        """The result as lines for a terminal."""
        d = self.dim
        if self.size is None:
            head = f"no {d} fits in {human_bytes(self.memory)}"
        else:
            proof = (
                f"{d} {self.size + 1} proven not to fit"
                if self.proven
                else f"{d} {self.size + 1}..{self.upper} open"
            )
            head = f"largest {d}: {self.size} ({proof})"
        lines = [head, f"bytes: {self.bytes_model}"]
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
        lines.append(f"per-block checkpoint (predicted): largest {d} {self.per_block_size}")
        return "\n".join(lines)


def fit(
    factory: Callable[[int], object],
    memory: int | str,
    dim: str = "batch",
    max_overhead: float | str | None = None,
    optimizer: str = "adamw",
    time_limit: float = 60.0,
    *,
    capture_sizes: Sequence[int] = (2, 3, 4),
    low: int = 1,
    high: int | None = None,
    capture_options: Mapping[str, object] | None = None,
    run: bool = True,
) -> Fit:
    """The largest size whose training step fits `memory` (bytes or "24GiB").

    `factory(size)` returns ``(model, example_inputs[, example_kwargs])`` at that size, the
    model's forward returning the loss. `max_overhead`: the compute cap, a multiple of computing
    every node once (1.3 or "1.3x"; None: unlimited). `optimizer`: "adamw", "sgd" or "none".
    `time_limit`: seconds for the solver's search (captures and runs come on top). `low`,
    `high`: the smallest and largest sizes tried (a model whose graph differs at small sizes,
    such as a language model at sequence length 1, is fitted from a larger `low`). `run`: run
    one real step at the size found, and eager's steps (each a real allocation of that size on
    this machine).

    Raises FitError (which size failed and why; a memory below the parameters, gradients and
    optimizer state; a graph that changes shape with the size) and ValueError (bad arguments).
    """
    if dim not in ("batch", "seq"):
        raise ValueError(f"dim must be 'batch' or 'seq', not {dim!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    cap = _overhead(max_overhead)
    memory = _memory_bytes(memory)
    graphs = SizedGraphs(factory, capture_sizes, dim, capture_options)
    prepared = {s: _prepare(graphs, s, optimizer) for s in capture_sizes}
    statics = {s: static for s, (_, static) in prepared.items()}
    first = statics[capture_sizes[0]]
    opt_temp = prepared[capture_sizes[0]][0].optimizer_temporaries()
    del prepared
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

    def search() -> FitResult:
        return largest_fitting(
            graphs, left, compute_budget=cap, low=low, high=high, time_limit=time_limit
        )

    found = search()
    if graphs.affine and found.size is not None:
        checked = [found.size] + ([found.size + 1] if found.upper == found.size + 1 else [])
        if any(graphs.refute(s) for s in checked):  # the prediction is wrong there: no answer
            found = search()  # rests on it; every size probed is captured
    probes = list(found.probes)
    size, upper = found.size, found.upper
    bytes_model = _bytes_model(graphs)
    schedule = found.schedule
    if size is not None:
        schedule, proven, more = _confirm(graphs, left, cap, size, upper, time_limit)
        probes += more
        if schedule is None:  # the capture at `size` refutes the prediction
            raise FitError(
                f"the capture at {dim} {size} does not fit where the affine bytes predicted it "
                f"would ({'; '.join(graphs.mismatches(size)[:3])}); fit with more capture sizes"
            )
    else:
        proven = found.proven
    static = None if size is None else static_at(size)
    budget = None if size is None else left(size)
    measured = _run(graphs, size, schedule, optimizer) if run and size is not None else None
    eager_size, eager_over = (
        _eager_size(graphs, memory, optimizer, low, (size or low - 1) + 1) if run else (None, None)
    )
    return Fit(
        dim=dim,
        memory=memory,
        size=size,
        proven=proven,
        upper=upper,
        budget=budget,
        schedule=schedule,
        static=static,
        optimizer_temporaries=opt_temp,
        measured_peak=measured,
        eager_size=eager_size,
        eager_over=eager_over,
        per_block_size=_per_block_size(graphs, left, low, high or 2 * (size or low)),
        bytes_model=bytes_model,
        probes=probes,
    )


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


def _prepare(graphs: SizedGraphs, size: int, optimizer: str) -> tuple[TrainingStep, StaticBytes]:
    """A fresh model at `size`, one eager step run: the step and what exists before the next."""
    step = TrainingStep(*build(graphs.factory, size, graphs.dim), optimizer)
    return step, step.prepare()


def _affine_static(statics: dict[int, StaticBytes]) -> Callable[[int], StaticBytes]:
    """The bytes before a step at any size: the model's the same at every captured size, the
    inputs' affine (FitError otherwise)."""
    sizes = sorted(statics)
    a, b = sizes[0], sizes[1]
    slope, rest = divmod(statics[b].inputs - statics[a].inputs, b - a)
    for s in sizes:
        if (
            statics[s].model != statics[a].model
            or rest
            or (statics[s].inputs != statics[a].inputs + slope * (s - a))
        ):
            raise FitError(
                f"the bytes before a step are not the model's plus inputs affine in the size: "
                f"{statics}; remat fit needs parameters that do not change with the size"
            )

    def at(size: int) -> StaticBytes:
        base = statics[a]
        return StaticBytes(
            base.parameters,
            base.gradients,
            base.optimizer_state,
            base.buffers,
            base.inputs + slope * (size - a),
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


def _confirm(
    graphs: SizedGraphs,
    left: Callable[[int], int],
    cap: str | None,
    size: int,
    upper: int | None,
    time_limit: float,
) -> tuple[solver.Schedule | None, bool, list[Probe]]:
    """Probe the captures at `size` and, where it was proven not to fit, `size` + 1: the
    schedule at `size` (None where the capture does not fit), whether size + 1 is proven not to
    fit, and the probes."""
    deadline = solver.Deadline.after(time_limit)
    at = probe(graphs(size), left(size), cap, deadline.share(0.5), size=size)
    probes = [at]
    proven = False
    if upper == size + 1:
        over = probe(graphs(size + 1), left(size + 1), cap, deadline, size=size + 1)
        probes.append(over)
        proven = over.verdict == DOES_NOT_FIT
    return (at.schedule if at.verdict == FITS else None), proven, probes


def _run(graphs: SizedGraphs, size: int, schedule: solver.Schedule | None, optimizer: str) -> int:
    """One real training step at `size` under `schedule` (remat's executor, on the captured
    model): its measured whole-step peak in bytes."""
    captured = graphs.capture(size)
    model, inputs, kwargs = captured.made
    rm = Rematerialized(model, captured.graph, schedule)
    step = TrainingStep(model, inputs, kwargs, optimizer, forward=rm)
    step.prepare()
    return step.measured_peak()


def _eager_size(
    graphs: SizedGraphs, memory: int, optimizer: str, low: int, high: int
) -> tuple[int | None, int | None]:
    """The largest size in [`low`, `high`] whose eager step measures within `memory` (bisection over
    measured steps) and the measured peak at that size + 1 (None where it was not run)."""
    measured: dict[int, int] = {}

    def peak(size: int) -> int:
        if size not in measured:
            step, _ = _prepare(graphs, size, optimizer)
            measured[size] = step.measured_peak()
        return measured[size]

    fits, top = low - 1, high  # fits: the largest that fits (low - 1: none), top does not
    if peak(high) <= memory:
        return high, None
    while top - fits > 1:
        middle = (fits + top) // 2
        if peak(middle) <= memory:
            fits = middle
        else:
            top = middle
    return (fits if fits >= low else None), measured.get(fits + 1)


def _per_block_size(
    graphs: SizedGraphs, left: Callable[[int], int], low: int, high: int
) -> int | None:
    """The largest size in [`low`, `high`] whose per-block checkpointing (every module block at the
    depth of least peak, `block_checkpoint`) peaks within the bytes left to the step
    (bisection: the peak never falls as the size grows, NOTE [monotone sizes])."""
    fits, top = low - 1, high + 1  # fits: the largest that fits (low - 1: none), top does not
    while top - fits > 1:
        middle = (fits + top) // 2
        if _per_block_peak(graphs(middle)) <= left(middle):
            fits = middle
        else:
            top = middle
    return fits if fits >= low else None


def _per_block_peak(graph: nx.DiGraph) -> int:
    """The least peak of checkpointing every module block of one depth, over the depths."""
    problem = solver.prepare(graph)
    modules = problem.module
    depth = max((m.count(".") + 1 for m in modules if m), default=0)
    peaks = [
        block_checkpoint(problem, [_cut(m, d) for m in modules]).schedule.peak
        for d in range(1, depth + 1)
    ]
    return min(peaks, default=solver.checkpoint_all_peak(problem))


def _cut(module: str, depth: int) -> str | None:
    """The module path cut to `depth` parts; None where it is shorter (no block)."""
    if not module or module.count(".") < depth - 1:
        return None
    return ".".join(module.split(".")[:depth])
