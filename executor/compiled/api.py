"""`executor.compile`: torch.compile with remat's schedule as the partition, its byte budget
measured under the compiling backend.

The budget holds by a bounded loop: solve at a solver budget, compile, measure the compiled
step's peak on the example inputs, and where it exceeds the budget solve again below the
schedule's predicted peak by the excess (doubled at each further miss), the last time at
"min" (the least-peak schedule), at most ``max_compiles`` times (`CompileReport.compiles`
counts them, the plain compile of a percentage's basis included). Where a schedule solved at
a solver budget recomputes an op that must run once (a random op whose draw does not replay,
or a mutation: `RematPartitioner`), the next compile is "min", whose least-peak search keeps
such ops once: returned where its measured peak is within the budget, else the error says
that least peak.

NOTE [one deadline]: ``time_limit`` bounds the whole call, compiles and measurements included,
as `solver.solve`'s does: one `Deadline` (with the first Ctrl-C's `Stop`) is made at the call.
The solves of each compile end by an equal share of the time left among the compiles left,
less what the rest of that compile and its measurement are expected to take (`_solve_seconds`;
"min" compiles once and solves as the first of two compiles would);
each compile starts only where the time left holds what the compiles before it took beyond
their solves (`expected_seconds`), each measurement only where it holds the measurements before
it. The model returned has its peak measured within the budget, its solves cut short by the
deadline reported (`CompileReport.stopped`); where the time runs out before such a model, the
call raises `CompileError` saying what was done and what ``time_limit`` the next step needs.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import solver
from executor.check import CheckReport
from executor.compiled.check import CompileCheck, check_compiled
from executor.compiled.partitioner import (
    LAYOUT,
    RegionPlan,
    RematPartitioner,
    _Infeasible,
    _RunsTwice,
    backend,
)
from executor.compiled.step import Measured, compiled_call, fresh_call, measure_step
from executor.errors import CompileError
from executor.fitting.graphs import expected_seconds
from executor.loss import default_loss
from executor.sac.plan import model_signature
from graph_capture.inputs import positional_inputs
from solver.core.budget import Budget, human_bytes
from solver.deadline import Deadline
from solver.errors import BudgetError
from solver.interrupt import call_deadline

__all__ = ["CompileCheck", "CompileReport", "CompiledModel", "compile"]


@dataclass
class Try:
    """One compile of the loop: the solver's budget (bytes; None for "min"), the schedule's
    predicted peak (bytes, the solver's model), the compiled step's measured peak (bytes) and
    the seconds of its compile and measurement."""

    solver_budget: int | None
    predicted: int
    measured: int
    seconds: float


@dataclass
class CompileReport:
    """What `executor.compile` did. ``budget``: the byte budget (None for "min");
    ``peak``: the returned step's measured peak (bytes); ``plain_peak``: the compiled step's
    measured peak without a plan, where a percentage needed it (else None); ``compiles``: every
    compile the call made; ``tries``: the loop's compiles in order; ``regions``: the returned
    model's plan per compiled region (saved set, recomputes, dead computes, schedule);
    ``stopped``: None, or why a solve of the returned plan ended before proving its schedule
    ("time limit", "interrupted"); ``check``: the returned step held against torch's
    (`executor.compiled.check`)."""

    budget: int | None
    peak: int
    plain_peak: int | None
    compiles: int
    tries: list[Try] = field(default_factory=list)
    regions: list[RegionPlan] = field(default_factory=list)
    stopped: str | None = None
    check: CheckReport | None = None


FORMAT = "remat-compiled/1"


class CompiledModel(nn.Module):
    """``model`` compiled whole with remat's partition; shares ``model``'s parameters. Call
    it as the model; ``remat`` is the `CompileReport`; ``backend`` and ``options`` are the
    compile's (torch.compile's backend name, inductor's options). ``save(path)`` writes the
    plan, ``CompiledModel.load(path, model, example_inputs=...)`` compiles it again without
    solving."""

    def __init__(
        self,
        model: nn.Module,
        call: Callable[..., Any],
        report: CompileReport,
        backend: str,
        options: Mapping[str, Any],
    ):
        super().__init__()
        self.model = model
        self._call = call
        self.remat = report
        self.backend = backend
        self.options = dict(options)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON: each compiled region's schedule (`solver.Schedule`'s JSON,
        with the fingerprint of the joint graph's DAG it belongs to), the compile's backend
        and options, the budget and the model's signature (`executor.sac.plan.model_signature`).
        CompileError where an option is not JSON."""
        data = {
            "format": FORMAT,
            "model_signature": model_signature(self.model),
            "backend": self.backend,
            "options": self.options,
            **{k: getattr(self.remat, k) for k in ("budget", "plain_peak", "stopped")},
            "regions": [json.loads(r.schedule.to_json()) for r in self.remat.regions],
        }
        try:
            text = json.dumps(data)
        except TypeError as e:
            raise CompileError(f"cannot save the compile's options {self.options}: {e}") from e
        Path(path).write_text(text)

    @classmethod
    def load(
        cls,
        path: str | Path,
        model: nn.Module,
        example_inputs: Sequence[object] | torch.Tensor,
        example_kwargs: Mapping[str, object] | None = None,
        *,
        loss_fn: Callable[[object], torch.Tensor] = default_loss,
        time_limit: float = 60,
        check: CompileCheck | None = None,
    ) -> CompiledModel:
        """``model`` compiled with the plan saved at `path` (`save`): the saved backend and
        options, each compiled region partitioned by its saved schedule (found by its joint
        graph's fingerprint, replayed on it), nothing solved. As `compile` does for each of its
        compiles, the step ``loss_fn(model(*example_inputs, **example_kwargs)).backward()`` is
        compiled (its first run) and its peak measured once (a second run, state restored);
        that is all it measures. CompileError (one line) for a file of another model (its
        signature), a compiled region the file has no schedule for (another graph: other
        inputs, code, torch or options), a measured peak above the saved budget, or a file
        that is not such a plan, a plan with offload ops where they cannot run (as `compile`'s
        ``offload``); ``time_limit`` bounds the compile, the measurement and the
        check, which holds the loaded step against torch's as `compile` does (``check``)."""
        data = _read_plan(path)
        if data["model_signature"] != model_signature(model):
            raise CompileError(
                f"{path} was saved for another model (parameters differ from "
                f"{type(model).__name__}'s): compile this model with executor.compile"
            )
        inputs = positional_inputs(example_inputs, CompileError)
        moves = {op[0] for r in data["regions"] for op in r.get("ops", ())} - {"compute", "free"}
        if moves:
            _on_accelerator(f"the plan at {path} offloads", model, inputs)
        with call_deadline(time_limit, CompileError) as deadline:
            steps = _Steps(model, inputs, dict(example_kwargs or {}), loss_fn, deadline)
            return cls._replay(steps, path, data, check or CompileCheck())

    @classmethod
    def _replay(
        cls, steps: _Steps, path: str | Path, data: dict[str, Any], check: CompileCheck
    ) -> CompiledModel:
        """`load`'s compile, measurement and check of the plan ``data`` read from ``path``."""
        schedules = {r["graph_fingerprint"]: json.dumps(r) for r in data["regions"]}
        budget = data["budget"]
        name, options = data["backend"], data["options"]
        partitioner = RematPartitioner(
            "min" if budget is None else budget,
            steps.deadline,
            replay_rng=name == "aot_eager",
            fuse=name == "inductor",
            schedules=schedules,
        )
        call, measured = steps.measure(backend(name, partitioner, options), partitioner)
        if budget is not None and measured.peak > budget:
            raise CompileError(
                f"the plan saved at {path} measured {measured.peak} B here, above its budget "
                f"{budget} B: compile again with executor.compile on this machine"
            )
        report = CompileReport(
            budget,
            measured.peak,
            data["plain_peak"],
            steps.compiles,
            [],
            partitioner.regions,
            data["stopped"],
            _check(steps, call, name, options, partitioner.regions, check),
        )
        return cls(steps.model, call, report, name, options)


def _options(kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(backend name, inductor options) from torch.compile's keyword arguments."""
    kwargs = dict(kwargs)
    name = kwargs.pop("backend", "inductor")
    mode = kwargs.pop("mode", None)
    options = dict(kwargs.pop("options", None) or {})
    if kwargs.pop("dynamic", False):
        raise CompileError("dynamic=True: remat budgets static shapes; drop dynamic=")
    kwargs.pop("fullgraph", None)  # always whole: a break is refused, naming it
    if kwargs:
        raise CompileError(f"torch.compile arguments {sorted(kwargs)} are not supported here")
    if mode is not None:
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode), **options}
    if not isinstance(name, str):
        raise CompileError("backend must be 'inductor' or 'aot_eager' (a name)")
    return name, options


def compile(
    model: nn.Module,
    example_inputs: Sequence[object] | torch.Tensor,
    budget: str | int | float,
    *,
    example_kwargs: Mapping[str, object] | None = None,
    time_limit: float = 60,
    loss_fn: Callable[[object], torch.Tensor] = default_loss,
    max_compiles: int = 4,
    check: CompileCheck | None = None,
    offload: solver.Link | str | None = None,
    **torch_compile_kwargs: Any,
) -> CompiledModel:
    """``model`` compiled by torch.compile (default backend inductor; ``torch_compile_kwargs``:
    ``backend`` "inductor" or "aot_eager", ``mode``, ``options``) with remat's schedule as the
    partition: the forward saves what the schedule keeps, the backward recomputes what it
    drops, where and as often as it says. ``budget`` (`solver.core.budget.Budget`): bytes,
    units ("512MiB"), a percentage of the compiled step's measured peak without a plan ("50%")
    or "min" (the least peak, then the least cost at it). The step is
    ``loss_fn(model(*example_inputs, **example_kwargs)).backward()`` (``example_inputs``: a
    tuple or list, or one tensor); its measured peak on the example inputs is within the
    budget, else `CompileError` (as for an output without a loss, `default_loss`).
    ``time_limit``: seconds for the whole call, solves, compiles and measurements included
    (NOTE [one deadline]); at most ``max_compiles`` compiles besides the plain compile of a
    percentage's basis. Before returning, one step of the compiled model is held against
    torch's own (``check``, `executor.compiled.check`: bit for bit against eager under
    aot_eager, within ``check.rtol`` of torch's partition under inductor); a difference is a
    `CompileError`, never a model returned. Ctrl-C (from the main thread, where SIGINT has
    Python's default handler): the first ends the call as the time limit does, a second raises
    KeyboardInterrupt.

    ``offload``: a host link (`solver.Link`, or a link's or target's name, ``"h100"``): the
    schedules may also offload values to host memory and reload them (docs/offload.md), emitted
    as torch's ``ao.offload`` / ``ao.reload`` ops (`executor.compiled.offload`). Those ops need
    an accelerator (pinned host memory, a transfer stream): on a CPU the call refuses in one
    line. Never run here: the graphs are checked as structure under fake tensors only
    (docs/compile.md)."""
    name, options = _options(torch_compile_kwargs)
    inputs = positional_inputs(example_inputs, CompileError)
    link = _offload_link(offload, model, inputs)
    try:
        wanted = Budget.of(budget)
    except BudgetError as e:
        raise CompileError(str(e)) from e
    with call_deadline(time_limit, CompileError) as deadline:
        steps = _Steps(model, inputs, dict(example_kwargs or {}), loss_fn, deadline)
        return _compile(steps, wanted, name, options, max_compiles, check or CompileCheck(), link)


@dataclass
class _Steps:
    """Compiles and measurements of ``model``'s step under one deadline, with their seconds."""

    model: nn.Module
    inputs: tuple[object, ...]
    kwargs: dict[str, object]
    loss_fn: Callable[[object], torch.Tensor]
    deadline: Deadline
    compiles: int = 0
    compile_seconds: dict[int, float] = field(default_factory=dict)  # beyond the solves
    measure_seconds: dict[int, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def rest(self) -> float | None:
        """Seconds a compile beyond its solves and its measurement are expected to take
        (None before any compile)."""
        if not self.compile_seconds:
            return None
        return expected_seconds(self.compile_seconds) + expected_seconds(self.measure_seconds)

    def measure(
        self, backend: Callable | str, partitioner: RematPartitioner | None
    ) -> tuple[Callable[..., Any], Measured]:
        """(the compiled call, `Measured`): ``model`` compiled by ``backend`` and measured,
        each where the deadline holds it (`CompileError` otherwise)."""
        rest = self.rest()
        if rest is not None and not self.deadline.leaves(rest):
            raise self.out_of_time(f"the next compile needs about {rest:.1f} s", rest)
        call = compiled_call(self.model, backend)
        self.compiles += 1
        try:
            measured: Measured = measure_step(
                self.model,
                call,
                self.inputs,
                self.kwargs,
                self.loss_fn,
                self.deadline,
                expected_seconds(self.measure_seconds),
            )
        except (CompileError, _Infeasible):
            raise
        except Exception as e:
            if partitioner is None:  # torch's own partition: the error is the model's
                raise
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise CompileError(
                f"the step compiled with remat's partition failed ({type(e).__name__}: "
                f"{first}); this is a defect in remat: report it with the model"
            ) from e
        solving = partitioner.solve_seconds if partitioner is not None else 0.0
        self.compile_seconds[self.compiles] = max(0.0, measured.compile_seconds - solving)
        if measured.peak is None:
            need = expected_seconds(self.measure_seconds) if self.measure_seconds else None
            raise self.out_of_time(f"compile {self.compiles} is not measured", need)
        self.measure_seconds[self.compiles] = measured.seconds
        return call, measured

    def out_of_time(self, what: str, need: float | None) -> CompileError:
        """The error when the deadline ends the call: what was done, what is next and what
        ``time_limit`` it would need (``need``: its seconds; None: not known)."""
        elapsed = time.perf_counter() - self.started
        why = "interrupted" if self.deadline.stopped() else "time limit"
        enough = f"above {elapsed:.0f} s" if need is None else f"of {elapsed + need:.0f} s or more"
        return CompileError(
            f"{why} after {self.compiles} compiles in {elapsed:.1f} s and no model to return; "
            f"{what}: a time_limit {enough} would allow it"
        )


def _compile(
    steps: _Steps,
    wanted: Budget,
    name: str,
    options: dict[str, Any],
    max_compiles: int,
    check: CompileCheck,
    link: solver.Link | None = None,
) -> CompiledModel:
    plain: list[int] = []

    def hundred() -> int:
        if not plain:
            _, measured = steps.measure(name if not options else _plain(name, options), None)
            plain.append(measured.peak)
        return plain[0]

    budget, minimum = wanted.text, wanted.least
    try:
        target = None if minimum else wanted.bytes(hundred)
    except BudgetError as e:
        raise CompileError(str(e)) from e
    deadline = steps.deadline
    tries: list[Try] = []
    solver_budget: int | str = "min" if minimum else target
    attempted: list[int | str] = []  # the solver budgets of the loop's compiles
    infeasible: _Infeasible | None = None  # the last compile's solve, below the least
    runs_twice: _RunsTwice | None = None  # a schedule refused for recomputing a run-once op
    for attempt in range(max_compiles):
        # "min" returns its first measured compile: its solves take a quarter of the time,
        # as the first of two compiles would, leaving the compile, whose seconds are not
        # known before it, and the measurement the rest
        # under inductor the check compiles torch's partition once more: a share of its own
        left = (2 if minimum else max_compiles - attempt) + (name == "inductor")
        solves = deadline.within(_solve_seconds(deadline.remaining(), left, steps.rest()))
        attempted.append(solver_budget)
        partitioner = RematPartitioner(
            solver_budget,
            solves,
            replay_rng=name == "aot_eager",
            fuse=name == "inductor",
            link=link,
        )
        started = time.perf_counter()
        try:
            call, measured = steps.measure(backend(name, partitioner, options), partitioner)
        except _Infeasible as e:
            timed_out = isinstance(e.error, solver.SolverTimeoutError)
            refused = isinstance(e, _RunsTwice)
            if refused:
                runs_twice = e
            # a solve cut short finds no schedule, and one that recomputes an op that must run
            # once is refused: the least-peak one ("min") is within the budget wherever any
            # schedule is, in the model, its search keeps run-once ops once, and the
            # measurement decides
            next_budget = "min" if timed_out or refused else _above_least(e, target, tries)
            if timed_out and next_budget in attempted:
                raise CompileError(
                    f"budget {budget} ({target} B): the solver found no schedule within it in "
                    f"its {partitioner.solve_seconds:.1f} s share of time_limit "
                    f"({str(e.error).splitlines()[0]}); raise time_limit or the budget"
                ) from e.error
            infeasible, solver_budget = e, next_budget
            if solver_budget in attempted:
                break
            continue
        infeasible = None
        predicted = max(r.schedule.peak for r in partitioner.regions)
        seconds = time.perf_counter() - started
        tries.append(
            Try(
                None if solver_budget == "min" else int(solver_budget),
                predicted,
                measured.peak,
                seconds,
            )
        )
        if minimum or measured.peak <= target:
            checked = _check(steps, call, name, options, partitioner.regions, check)
            stopped = "interrupted" if deadline.stopped() else "time limit"
            report = CompileReport(
                None if minimum else target,
                measured.peak,
                plain[0] if plain else None,
                steps.compiles,
                tries,
                partitioner.regions,
                stopped if partitioner.cut_short else None,
                checked,
            )
            return CompiledModel(steps.model, call, report, name, options)
        if solver_budget == "min":
            break  # the least-peak schedule measured over the budget
        # below the schedule's predicted peak (the solver budget may lie far above it) by the
        # excess, doubled at each further miss: inductor's peak moves in steps; the last
        # compile (or a budget lowered to nothing) is the least-peak schedule's, the likeliest
        # to measure within the budget where the model's peaks miss inductor's
        below = min(int(solver_budget), predicted)
        lowered = below - (measured.peak - target) * 2 ** (len(tries) - 1)
        last = attempt == max_compiles - 2 or lowered <= 0
        solver_budget = "min" if last and "min" not in attempted else lowered
        if solver_budget != "min" and solver_budget <= 0:
            break
    if runs_twice is not None:  # "min" followed it: measured over the budget, or not compiled
        raise _runs_once(budget, target, tries, runs_twice, max_compiles) from runs_twice.error
    if infeasible is not None:
        raise _below_least(budget, target, tries, infeasible) from infeasible.error
    if tries[-1].solver_budget is None:
        raise CompileError(
            f"budget {budget} ({target} B) is below the least remat's partition reaches "
            f"compiled: its least-peak schedule measured {tries[-1].measured} B "
            f"({human_bytes(tries[-1].measured)}): raise the budget, use 'min', or compile "
            "without remat (torch's partition can measure lower where inductor's layout or "
            "fusion choices differ from remat's model)"
        )
    raise CompileError(
        f"budget {budget} ({target} B): after {len(tries)} compiles the compiled step still "
        f"measured {tries[-1].measured} B ({human_bytes(tries[-1].measured)}); raise the "
        f"budget or max_compiles"
    )


def _offload_link(
    offload: solver.Link | str | None, model: nn.Module, inputs: Sequence[object]
) -> solver.Link | None:
    """The host link ``offload`` names (None: none), where torch's offload ops run: on the
    accelerator that holds the step's tensors; `CompileError` in one line otherwise."""
    if offload is None:
        return None
    from solver.core.link import LinkError
    from solver.target.devices import host_link

    try:
        link = host_link(offload)
    except LinkError as e:
        raise CompileError(f"offload: {str(e).splitlines()[0]}") from e
    _on_accelerator(f"offload={offload!r}", model, inputs)
    return link


def _on_accelerator(what: str, model: nn.Module, inputs: Sequence[object]) -> None:
    """`CompileError` in one line where torch's offload ops cannot run the step: its tensors
    are on the CPU, or no accelerator is available."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for t in inputs if isinstance(t, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    if device.type == "cpu" or not torch.accelerator.is_available():
        raise CompileError(
            f"{what}: torch's offload ops (ao::offload, ao::reload) copy through pinned host "
            f"memory on an accelerator's transfer stream, and this step runs on {device.type}: "
            "compile without offload, or offload with remat's own executor "
            "(executor.rematerialize(..., offload=...))"
        )


def _check(
    steps: _Steps,
    call: Callable[..., Any],
    name: str,
    options: dict[str, Any],
    regions: list[RegionPlan],
    check: CompileCheck,
) -> CheckReport:
    """`check_compiled` of ``call`` against eager (aot_eager) or torch's partition compiled with
    remat's inductor options, where the deadline leaves a compile for it."""
    if name == "aot_eager":
        reference, label = fresh_call(steps.model), "eager"
    else:
        rest = steps.rest() or 0.0
        if not steps.deadline.leaves(rest):
            raise steps.out_of_time(f"the check's compile needs about {rest:.1f} s", rest)
        reference = compiled_call(steps.model, _plain(name, {**LAYOUT, **options}))
        label = "torch's own partition compiled with the same options"
    random_ops = any(
        r.dag.nodes[v].get("once") and not r.dag.nodes[v].get("mutates")
        for r in regions
        for v in r.dag.nodes
    )
    return check_compiled(
        steps.model,
        call,
        reference,
        steps.inputs,
        steps.kwargs,
        steps.loss_fn,
        exact=name == "aot_eager",
        options=check,
        reference_name=label,
        random_ops=random_ops,
    )


def _read_plan(path: str | Path) -> dict[str, Any]:
    """The JSON of a plan `CompiledModel.save` wrote; CompileError for anything else."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ValueError(f"format {found!r}, not {FORMAT!r}")
        keys = ("model_signature", "backend", "options", "budget", "plain_peak", "stopped")
        missing = [k for k in (*keys, "regions") if k not in data]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        if not all(isinstance(r, dict) and "graph_fingerprint" in r for r in data["regions"]):
            raise ValueError("a region without a schedule")
    except (OSError, ValueError) as e:
        raise CompileError(
            f"{path} is not a compiled plan file ({e}): write one with CompiledModel.save"
        ) from e
    return data


def _solve_seconds(left: float, tries: int, rest: float | None) -> float:
    """Seconds for the solves of the next of ``tries`` compiles when ``left`` seconds remain
    and a compile beyond its solves, with its measurement, is expected to take ``rest`` (None:
    not known yet, taken as half of a compile's equal share): an equal share of what the
    compiles leave, or where that is nothing, of what this one leaves."""
    if rest is None:
        return left / tries / 2
    return max(left / tries - rest, (left - rest) / tries, 0.0)


def _plain(name: str, options: dict[str, Any]) -> Callable:
    """The backend ``name`` with inductor ``options`` and torch's own partition."""
    from torch._inductor.compile_fx import compile_fx

    if name != "inductor":
        raise CompileError(f"backend {name!r} takes no options")
    return functools.partial(compile_fx, config_patches=options)


def _above_least(e: _Infeasible, target: int, tries: list[Try]) -> int | str:
    """The next solver budget where ``target`` is below the least schedule's peak in the
    solver's model: the budget is about the measured peak, which the model overestimates by
    up to what the tries measured under their prediction, so the next try solves at the
    target raised by that overestimate, at least the model's least ("min" where the least is
    not known)."""
    least = getattr(e.error, "minimum_bytes", None)
    if least is None:
        return "min"
    over = max((t.predicted - t.measured for t in tries), default=0)
    return max(int(least), target + over)


def _below_least(budget: object, target: int | None, tries: list[Try], e: _Infeasible):
    least = getattr(e.error, "minimum_bytes", None)
    floor = getattr(e.error, "lower_bound_bytes", None)
    hint = ""
    if least is None and floor is not None:
        least, hint = (
            floor,
            f"; the least schedule peaks at no less than {floor} B in the solver's model",
        )
    elif least is not None:
        hint = f"; the least schedule peaks at {least} B in the solver's model"
        if tries:
            more = max(t.measured - t.predicted for t in tries)
            hint += f", about {least + more} B measured ({human_bytes(least + more)})"
    return CompileError(
        f"budget {budget} ({target} B) is below the least remat's partition reaches "
        f"compiled{hint}: raise the budget, use 'min', or compile without remat (torch's "
        "partition can measure lower where inductor's layout or fusion choices differ from "
        "remat's model)"
    )


def _runs_once(
    budget: object, target: int | None, tries: list[Try], e: _RunsTwice, max_compiles: int
) -> CompileError:
    """The error where the schedules within the budget recompute an op that must run once and
    the least-peak schedule, which runs it once, measured over the budget (the last try) or was
    not compiled (``max_compiles`` spent before it)."""
    what = (
        f"budget {budget} ({target} B): the solver's schedules within it recompute {e.op}, "
        "which draws random numbers or mutates and must run once"
    )
    if not tries or tries[-1].solver_budget is not None:
        return CompileError(
            f"{what}; the least-peak schedule, which runs it once, was not compiled within "
            f"max_compiles={max_compiles}: raise max_compiles or the budget, or use 'min'"
        )
    least = tries[-1].measured
    return CompileError(
        f"{what}; the least peak that runs it once measured {least} B ({human_bytes(least)}, "
        "'min'): raise the budget to it, use 'min', or compile without remat"
    )
