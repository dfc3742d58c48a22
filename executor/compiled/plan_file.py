"""The plan file of a `CompiledModel` (JSON, format `FORMAT`): `write_plan` writes it,
`read_plan` reads it back, `replay_plan` compiles the model with its schedules, nothing solved."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from executor.compiled.budget_loop import CompiledSteps, check_step
from executor.compiled.check import CompileCheck
from executor.compiled.partitioner import RematPartitioner, backend
from executor.compiled.report import CompileReport
from executor.errors import CompileError
from executor.sac.plan import model_signature

FORMAT = "remat-compiled/1"


def write_plan(
    path: str | Path,
    model: nn.Module,
    backend_name: str,
    options: dict[str, Any],
    report: CompileReport,
) -> None:
    """Write the plan of ``model`` compiled by ``backend_name`` with ``options`` (``report``'s
    regions, budget, plain peak and stop) at ``path``, as `CompiledModel.save` says.
    CompileError where an option is not JSON."""
    data = {
        "format": FORMAT,
        "model_signature": model_signature(model),
        "backend": backend_name,
        "options": options,
        **{k: getattr(report, k) for k in ("budget", "plain_peak", "stopped")},
        "regions": [json.loads(r.schedule.to_json()) for r in report.regions],
    }
    try:
        text = json.dumps(data)
    except TypeError as e:
        raise CompileError(f"cannot save the compile's options {options}: {e}") from e
    Path(path).write_text(text)


def read_plan(path: str | Path) -> dict[str, Any]:
    """The JSON of a plan `CompiledModel.save` wrote; CompileError for anything else."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise CompileError(f"format {found!r}, not {FORMAT!r}")
        keys = ("model_signature", "backend", "options", "budget", "plain_peak", "stopped")
        missing = [k for k in (*keys, "regions") if k not in data]
        if missing:
            raise CompileError(f"no {', '.join(missing)}")
        if not all(isinstance(r, dict) and "graph_fingerprint" in r for r in data["regions"]):
            raise CompileError("a region without a schedule")
    except (OSError, ValueError) as e:
        raise CompileError(
            f"{path} is not a compiled plan file ({e}): write one with CompiledModel.save"
        ) from e
    return data


def replay_plan(
    steps: CompiledSteps, path: str | Path, data: dict[str, Any], check: CompileCheck
) -> tuple[Callable[..., Any], CompileReport]:
    """(the compiled call, its `CompileReport`): `CompiledModel.load`'s compile, measurement
    and check of the plan ``data`` read from ``path``."""
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
        check_step(steps, call, name, options, partitioner.regions, check),
    )
    return call, report
