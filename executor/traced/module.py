"""`Rematerialized`: a model wrapped to train under a solved rematerialization schedule (how
its step runs: `executor.traced.step`); the schedule file it loads, checked against its capture
(`load_schedule`); the step held against eager's before a module is handed over
(`check_against_eager`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import networkx as nx
import torch
import torch.utils._pytree as pytree
from torch import nn

from executor.check import CheckReport, Failure, NamedValues, check_step
from executor.errors import RematerializeError
from executor.traced.checks import check_call
from executor.traced.estimated import EstimateCheck, match_estimated
from executor.traced.offload import HostPool
from executor.traced.step import Program, RematFunction
from graph_capture.captured import CapturedGraph
from graph_capture.inputs import positional_inputs
from graph_capture.trace.zero_tangents import output_leaves
from solver.core.schedule import Schedule
from solver.core.simulate import simulate
from solver.errors import ScheduleMismatchError, SpellingError
from solver.spelling import spelled

__all__ = ["Rematerialized", "check_against_eager", "load_schedule"]


class Rematerialized(nn.Module):
    """`model` trained under `schedule`: same outputs, bit-identical gradients, less memory.

    Use it like the model: ``out = rm(*inputs, **kwargs); loss(out).backward();
    optimizer.step()``. Parameters are the model's own (``rm.parameters()`` yields them), so an
    optimizer built on either works, and so does ``DistributedDataParallel(rm)``. Inputs must
    match the captured example in count, keyword names, shape, dtype and device, and a step
    must run under the autocast state the graph was captured under.
    A schedule solved in estimate mode (``schedule.extra["target"]``) is matched to ``captured``
    by structure (`executor.traced.estimated`), and its first step measures its peak:
    `estimate_check` and an `EstimatedPeakWarning` report it against the predicted one.
    In eval mode (``rm.eval()``) it calls the model directly: the schedule is for training.
    ``compiled=True`` runs the schedule as generated straight-line code (`executor.traced.codegen`);
    ``compiled=False`` walks it with `ScheduleInterpreter` (same results, slower, debuggable).
    """

    def __init__(
        self,
        model: nn.Module,
        captured: CapturedGraph,
        schedule: Schedule,
        *,
        compiled: bool = True,
    ) -> None:
        super().__init__()
        if _estimated_for_another(schedule, captured):
            schedule = match_estimated(schedule, captured.dag, "given")
        schedule.check_graph(captured.dag)
        simulate(captured.dag, schedule.ops, schedule.link).raise_if_invalid()
        self.model = model
        self.captured = captured
        self.schedule = schedule
        self._program = Program(model, captured, schedule, compiled)
        self._check: CheckReport | None = None

    def save(self, path: str | Path) -> None:
        """Write the schedule (`solver.Schedule.save`: its ops, claims and the fingerprint of
        the graph it belongs to), what `load` reads back for this model."""
        self.schedule.save(path)

    @classmethod
    @spelled
    def load(
        cls,
        path: str | Path,
        model: nn.Module,
        example_inputs: Sequence[torch.Tensor] | torch.Tensor,
        *,
        example_kwargs: Mapping[str, torch.Tensor] | None = None,
        capture_options: Mapping[str, object] | None = None,
    ) -> Rematerialized:
        """Capture `model` on the example inputs and load the schedule at `path` (`save`, or
        solved offline: `remat solve --out`; `load_schedule`). `capture_options` go to
        `graph_capture.capture` and must be those the schedule's graph was captured with
        (``backward_from``, ``granularity``, ...), as must torch's thread count.

        Raises solver.errors.ScheduleMismatchError (one line) when the file was solved for
        another graph: another model, other inputs or other capture options. Like
        `rematerialize`, it returns only a module whose step on the example inputs matched
        eager's bit for bit (`check_against_eager`: `RematerializeError` otherwise).
        """
        from graph_capture import capture

        captured = capture(
            model, example_inputs, example_kwargs=example_kwargs, **(capture_options or {})
        )
        loaded = cls(model, captured, load_schedule(path, captured.dag))
        check_against_eager(loaded, example_inputs, example_kwargs)
        return loaded

    @classmethod
    def from_file(cls, *_args: object, **_kwargs: object) -> NoReturn:
        """Refused: loading is `Rematerialized.load(path, model, example_inputs, ...)`."""
        raise SpellingError(
            "Rematerialized.from_file is not the spelling: use Rematerialized.load(path, "
            "model, example_inputs, *, example_kwargs=None, capture_options=None)"
        )

    @property
    def check(self) -> CheckReport | None:
        """The step held against eager's before this module was handed over
        (`check_against_eager`: `rematerialize` and `load` make it); None where none ran (the
        module built directly from a capture, or a capture in estimate mode)."""
        return self._check

    @property
    def estimate_check(self) -> EstimateCheck | None:
        """For a schedule solved in estimate mode, its first step's measured peak against the
        predicted one, once that step's backward has run; else None."""
        first = self._program.first_step
        return None if first is None else first.check

    @property
    def predicted_peak_bytes(self) -> int:
        """The schedule's peak (`solver.simulate`): live values plus the transient bytes of the
        op running. With capture's transients (each op's measured workspace and the bytes this
        executor holds beside the values) it is what the step measures above its start, with
        ``.grad`` allocated before the step (docs/executor.md, "The byte budget")."""
        return self.schedule.peak

    @property
    def host_pool(self) -> HostPool | None:
        """The host memory the schedule's offloaded copies occupy (`HostPool`: bytes held now
        and at peak, over every step so far, `reset_peak` to start again); None for a schedule
        without a link. A step's host peak is the schedule's predicted one
        (``schedule.extra["host_peak"]``, `solver.simulate`'s ``host_peak``)."""
        transfers = self._program.transfers
        return None if transfers is None else transfers.pool

    def forward(self, *inputs: torch.Tensor, **kwargs: torch.Tensor) -> object:
        if not self.training:
            return self.model(*inputs, **kwargs)
        check_call(self.captured, self._program.params[0].device, inputs, kwargs)
        flat = self.captured.flat_inputs(inputs, kwargs)
        params = self._program.params
        outputs = RematFunction.apply(self._program, len(params), *params, *flat)
        return pytree.tree_unflatten(list(outputs), self.captured.output_treespec)


def load_schedule(path: str | Path, dag: nx.DiGraph) -> Schedule:
    """The schedule file at `path`, checked against the captured `dag` (`Schedule.load`). Where
    it belongs to another graph and the two captures ran with different torch thread counts
    (graph attribute ``threads``, `extra["threads"]` of the schedule), the error says so: an
    op's workspace bytes depend on that count. A schedule solved in estimate mode is matched
    by structure (`executor.traced.estimated.match_estimated`)."""
    schedule = Schedule.load(path)
    if _estimated_for_another(schedule, dag):
        return match_estimated(schedule, dag, path)
    try:
        return Schedule.load(path, dag)
    except ScheduleMismatchError as error:
        solved, here = Schedule.load(path).extra.get("threads"), dag.graph.get("threads")
        if solved is None or here is None or solved == here:
            raise
        raise ScheduleMismatchError(
            f"{error} The schedule was solved on a capture with {solved} thread(s) and this "
            f"capture ran with {here}: an op's workspace bytes depend on the thread count, so "
            f"capture with {solved} (torch.set_num_threads, or remat run --threads {solved})."
        ) from error


def _estimated_for_another(schedule: Schedule, captured: CapturedGraph | nx.DiGraph) -> bool:
    """A schedule solved in estimate mode, not yet matched to ``captured``, a measured one."""
    dag = captured.dag if isinstance(captured, CapturedGraph) else captured
    extra = schedule.extra
    return "target" in extra and "estimated_peak" not in extra and "target" not in dag.graph


def check_against_eager(
    remat: Rematerialized,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
) -> CheckReport | None:
    """Hold one step of ``remat`` on the example inputs against one eager step of its model
    from the same state (`executor.check.check_step`), bit for bit: every output, every
    input's and parameter's ``.grad``, every buffer. The step backpropagates what the capture
    did (`CapturedGraph.default_tangents`: ones into each differentiable output, zeros into
    those ``backward_from`` leaves out). The model's buffers, ``.grad`` and generator states
    are left as found; the report is ``remat.check``. A capture in estimate mode (graph
    attribute ``target``: fake tensors, nothing to run) is not checked: None.

    Cost: one eager and one rematerialized step (docs/executor.md, "The check before
    handing over"). Raises `RematerializeError` naming the first value that differs and its
    relative difference."""
    captured = remat.captured
    if "target" in captured.dag.graph:
        return None
    inputs = positional_inputs(example_inputs, RematerializeError)
    kwargs = dict(example_kwargs or {})
    program = remat._program
    first_step, program.first_step = program.first_step, None  # the user's first step measures
    try:
        remat._check = check_step(
            remat.model,
            _tangent_step(remat, captured, inputs, kwargs),
            _tangent_step(remat.model, captured, inputs, kwargs),
            Failure(
                subject="the rematerialized step",
                reference_name="eager's on the example inputs",
                error=RematerializeError,
                advice=(
                    "the traced graph computes another way than eager here (e.g. an HF model "
                    "whose eager code reads input values to choose its attention kernel, "
                    "docs/training.md); train this model without remat, and report it with the "
                    "model"
                ),
            ),
        )
    finally:
        program.first_step = first_step
    return remat._check


def _tangent_step(
    call: nn.Module,
    captured: CapturedGraph,
    inputs: Sequence[object],
    kwargs: Mapping[str, object],
) -> Callable[[], NamedValues]:
    """One step through ``call`` on fresh leaves of the inputs, backward from the capture's
    default tangents; returns every tensor output ("output NAME") and every input gradient
    ("grad of input NAME")."""
    names = {k: name for name, ks in output_leaves(captured.output_treespec).items() for k in ks}

    def leaf(x: object) -> object:
        return x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    def step() -> NamedValues:
        args = [leaf(x) for x in inputs]
        keywords = {k: leaf(v) for k, v in kwargs.items()}
        flat, _ = pytree.tree_flatten(call(*args, **keywords))
        diff = [flat[i] for i in captured.tangent_output_indices]
        torch.autograd.backward(diff, captured.default_tangents())
        values = [
            (f"output {names.get(k, k)!r} (flat output {k})", x.detach().clone())
            for k, x in enumerate(flat)
            if isinstance(x, torch.Tensor)
        ]
        leaves = [*enumerate(args), *keywords.items()]
        values += [
            (f"grad of input {k!r}", x.grad)
            for k, x in leaves
            if isinstance(x, torch.Tensor) and x.grad is not None
        ]
        return values

    return step
