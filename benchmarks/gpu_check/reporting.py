"""The run's report: its header (`describe`, with the host link `measure_link` measures) and the
markdown table, one `row` per cell."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.gpu_check.spec import (
    DETERMINISM,
    MODELS,
    QUICK_LINK_BYTES,
    RUN_LIMITS,
    Cell,
    compile_backend,
    model_budget,
    run_budget,
)

COLUMNS = (
    "model",
    "runtime",
    "result",
    "budget",
    "status",
    "predicted peak",
    "measured peak",
    "measured / predicted",
    "predicted s",
    "measured s",
    "grads",
    "predicted host peak",
    "measured host peak",
    "copies",
    "what moves",
    "seconds",
)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f} MiB"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.2f} ms"


def row(cell: Cell) -> str:
    ratio = (
        f"{cell.measured_peak / cell.predicted_peak:.4f}"
        if cell.measured_peak is not None and cell.predicted_peak
        else "-"
    )
    values = (
        cell.model,
        cell.runtime,
        cell.result.replace("|", "\\|"),
        _mib(cell.budget),
        cell.status or "-",
        _mib(cell.predicted_peak),
        _mib(cell.measured_peak),
        ratio,
        _s(cell.predicted_s),
        _s(cell.measured_s),
        cell.grads or "-",
        _mib(cell.predicted_host_peak),
        _mib(cell.measured_host_peak),
        "-" if cell.copies is None else str(cell.copies),
        (cell.moved or "-").replace("|", "\\|"),
        f"{cell.seconds:.1f}",
    )
    return "| " + " | ".join(values) + " |"


def report(cells: Sequence[Cell], header: Sequence[str]) -> str:
    """The markdown report: what ran, then one table."""
    lines = [*header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + [row(c) for c in cells]) + "\n"


def measure_link(args: argparse.Namespace) -> Path:
    """``--link measured``: the host link measured on ``--device``
    (`graph_capture.measurement.link`: pinned memory, a side stream and CUDA events on CUDA; a
    copy into a host pool on the CPU), saved as ``link.json`` in ``--out`` (a device file:
    ``--target``'s published figures on CUDA, this processor's on the CPU, with the measured
    link), which the workers read by path. Copies of `LINK_BYTES`, `QUICK_LINK_BYTES` with
    ``--quick``."""
    import dataclasses

    from graph_capture.measurement.link import LINK_BYTES, measure_host_link
    from graph_capture.measurement.roofline import cpu_device
    from solver.target.devices import builtin_device

    base = builtin_device(args.target) if args.device == "cuda" else cpu_device()
    nbytes = QUICK_LINK_BYTES if args.quick else LINK_BYTES
    device = dataclasses.replace(base, host_link=measure_host_link(args.device, nbytes))
    path = args.out / "link.json"
    device.save(path)
    return path


def describe(args: argparse.Namespace, measured: Path | None, structure: str) -> list[str]:
    """The run's header lines: command, device, the deterministic settings, link, how SAC and
    compile run, models, the structure step's line, the most the run can take."""
    from solver.target.devices import named_link

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU, one thread"
    cuda = args.device == "cuda"
    if measured is None:
        link = named_link(args.link)
        source = "the published figure (`solver.target.devices.named_link`)"
    else:
        link = named_link(str(measured))
        published = named_link(args.target)
        how = "pinned, a side stream, CUDA events" if cuda else "a copy into a host pool"
        source = (
            f"measured here ({how}; `{measured.name}`); {args.target}'s published figure: "
            f"{published.d2h / 1e9:g} and {published.h2d / 1e9:g} GB/s"
        )
    scale = args.limit_scale
    budgets = ", ".join(
        f"{m} {model_budget(scale, m in args.compile_models):.0f} s" for m in args.models
    )
    own = ", ".join(f"{k} {v * scale:.0f} s" for k, v in RUN_LIMITS.items())
    return [
        f"`python -m benchmarks.gpu_check {' '.join(args.argv)}`".replace(" `", "`"),
        "",
        f"- device: {args.device} ({device}), torch {torch.__version__}",
        f"- deterministic: {', '.join(DETERMINISM)} (the variable set before torch is "
        "imported in each model's process); a cell is WRONG only where eager repeats itself "
        "bit for bit (the eager row's grads) and the runtime differs; where eager does not, "
        "the runtime is held to eager's own spread (UNSURE beyond it)",
        f"- link `{args.link}`: {link.d2h / 1e9:g} GB/s device-to-host, {link.h2d / 1e9:g} GB/s "
        f"host-to-device, {source}",
        "- SAC: the model itself planned on the device (`checkpoint_plan` measured there: its "
        "op stream, the device's allocation events, seconds with the device synchronized); "
        "its per-copy offload overhead is measured on the device too (the sac+offload row)",
        f"- compile: backend {compile_backend(args.device)}, cells for "
        f"{' '.join(args.compile_models) or 'no model'} (--compile-models; the others skipped)",
        "- offload cells: budgets below keep/recompute's least peak (own executor, compile: "
        "an eighth of the way to the one-op floor; SAC: the least plan with the link), so "
        "that the plan moves copies; a plan that moves none reads `no copy`",
        f"- shapes: {'--quick' if args.quick else 'full'}; "
        + "; ".join(f"{m}: {MODELS[m].description}" for m in args.models),
        f"- structure: {structure}",
        f"- at most {run_budget(scale, args.models, args.compile_models):.0f} s ({own}; "
        f"{budgets} of phase limits)",
    ]
