"""The run's report: its header (`describe`, with the host link `measure_link` measures) and the
markdown table, one `row` per cell."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.gpu_check.spec import MODELS, QUICK_LINK_BYTES, Cell, compile_backend, model_budget

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
    "host predicted",
    "host measured",
    "copies",
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
        _mib(cell.host_predicted),
        _mib(cell.host_measured),
        cell.copies or "-",
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


def describe(args: argparse.Namespace, measured: Path | None) -> list[str]:
    """The run's header lines: command, device, link, models, the most it can take."""
    from solver.target.devices import named_link

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU, one thread"
    models = args.models or list(MODELS)
    cuda = args.device == "cuda"
    planned = f"estimate mode for target {args.target}" if cuda else "recorded here"
    backend = compile_backend(args.device)
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
    return [
        f"`python -m benchmarks.gpu_check {' '.join(args.argv)}`".replace(" `", "`"),
        "",
        f"- device: {args.device} ({device}), torch {torch.__version__}",
        f"- link `{args.link}`: {link.d2h / 1e9:g} GB/s device-to-host, {link.h2d / 1e9:g} GB/s "
        f"host-to-device, {source}",
        f"- SAC plans: {planned}; compile backend: {backend}",
        f"- shapes: {'--quick' if args.quick else 'full'}; "
        + "; ".join(f"{m}: {MODELS[m].description}" for m in models),
        f"- at most {model_budget(args.limit_scale) * len(models):.0f} s "
        f"({len(models)} models x {model_budget(args.limit_scale):.0f} s of phase limits)",
    ]
