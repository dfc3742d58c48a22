"""`executor.compile`: torch.compile with remat's schedule as the partition, its byte budget
measured under the compiling backend (the loop and NOTE [one deadline]:
`executor.compiled.budget_loop`); `CompiledModel`, the model it returns, saved and loaded as a
plan file (`executor.compiled.plan_file`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import solver
from executor.compiled.budget_loop import BudgetLoop, CompiledSteps
from executor.compiled.check import CompileCheck
from executor.compiled.offload import PinnedPool, transfer_link
from executor.compiled.plan_file import read_plan, replay_plan, write_plan
from executor.compiled.report import CompileReport
from executor.errors import CompileError
from executor.loss import default_loss
from executor.sac.plan import model_signature
from graph_capture.inputs import positional_inputs
from solver.core.budget import Budget
from solver.errors import BudgetError
from solver.interrupt import call_deadline
from solver.spelling import spelled

__all__ = ["CompileCheck", "CompileReport", "CompiledModel", "compile"]


class CompiledModel(nn.Module):
    """``model`` compiled whole with remat's partition; shares ``model``'s parameters. Call
    it as the model; ``remat`` is the `CompileReport`; ``backend`` and ``options`` are the
    compile's (torch.compile's backend name, inductor's options). ``save(path)`` writes the
    plan, ``CompiledModel.load(path, model, example_inputs=...)`` compiles it again without
    solving. ``host_pool``: where the plan offloads, torch's pinned host-memory pool for its
    offload ops (`executor.compiled.offload.PinnedPool`), opened at the first call and held
    open across steps, so each step reuses the pinned buffers of the one before
    (``host_pool.host_idle()`` counts them; ``host_pool.close()`` frees them); None otherwise."""

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
        offloads = any(kind == "offload" for r in report.regions for kind, _ in r.schedule.ops)
        self.host_pool = PinnedPool() if offloads else None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.host_pool is not None:
            self.host_pool.open()
        return self._call(*args, **kwargs)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON: each compiled region's schedule (`solver.Schedule`'s JSON,
        with the fingerprint of the joint graph's DAG it belongs to), the compile's backend
        and options, the budget and the model's signature (`executor.sac.plan.model_signature`).
        CompileError where an option is not JSON."""
        write_plan(path, self.model, self.backend, self.options, self.remat)

    @classmethod
    @spelled
    def load(
        cls,
        path: str | Path,
        model: nn.Module,
        example_inputs: Sequence[object] | torch.Tensor,
        *,
        example_kwargs: Mapping[str, object] | None = None,
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
        data = read_plan(path)
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
            steps = CompiledSteps(model, inputs, dict(example_kwargs or {}), loss_fn, deadline)
            call, report = replay_plan(steps, path, data, check or CompileCheck())
            return cls(steps.model, call, report, data["backend"], data["options"])


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


@spelled
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
    (NOTE [one deadline] in `executor/compiled/budget_loop.py`); at most ``max_compiles``
    compiles besides the plain compile of a percentage's basis. Before returning, one step of
    the compiled model is held against torch's own (``check``, `executor.compiled.check`: bit
    for bit against eager under aot_eager, within ``check.rtol`` of torch's partition under
    inductor); a difference is a `CompileError`, never a model returned. Ctrl-C (from the main
    thread, where SIGINT has Python's default handler): the first ends the call as the time
    limit does, a second raises KeyboardInterrupt.

    ``offload``: a host link (`solver.Link`, or a link's or target's name, ``"h100"``): the
    schedules may also offload values to host memory and reload them (docs/offload.md), emitted
    as torch's ``ao.offload`` / ``ao.reload`` ops (`executor.compiled.offload`). Those ops need
    an accelerator (pinned host memory, a transfer stream): on a CPU the call refuses in one
    line. Never run here: the graphs are checked as structure under fake tensors only
    (docs/compile.md).

    Exception to the 8-parameter rule: a public entry point whose keyword-only parameters are
    the one interface's options."""
    name, options = _options(torch_compile_kwargs)
    inputs = positional_inputs(example_inputs, CompileError)
    link = _offload_link(offload, model, inputs)
    try:
        wanted = Budget.of(budget)
    except BudgetError as e:
        raise CompileError(str(e)) from e
    with call_deadline(time_limit, CompileError) as deadline:
        steps = CompiledSteps(model, inputs, dict(example_kwargs or {}), loss_fn, deadline)
        loop = BudgetLoop(steps, wanted, name, options, max_compiles, check or CompileCheck(), link)
        call, report = loop.run()
        return CompiledModel(steps.model, call, report, name, options)


def _offload_link(
    offload: solver.Link | str | None, model: nn.Module, inputs: Sequence[object]
) -> solver.Link | None:
    """The host link ``offload`` names (None: none), as torch's offload ops run it (one engine
    for both directions, `transfer_link`), where they run: on the accelerator that holds the
    step's tensors; `CompileError` in one line otherwise."""
    if offload is None:
        return None
    from solver.core.link import LinkError
    from solver.target.devices import host_link

    try:
        link = host_link(offload)
    except LinkError as e:
        raise CompileError(f"offload: {str(e).splitlines()[0]}") from e
    # a name as given; a Link not by its repr (every field's digits: a table cell's line)
    what = f"offload={offload!r}" if isinstance(offload, str) else "offload (a solver.Link)"
    _on_accelerator(what, model, inputs)
    return transfer_link(link)


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
