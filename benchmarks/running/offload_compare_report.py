"""`benchmarks.running.offload_compare`'s results: one `Row` per method, and the rows as a
Markdown table (`table`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Row:
    """One method's measured and predicted figures (bytes, seconds)."""

    model: str
    method: str
    budget: int | None
    device_peak: int | None = None
    host_peak: int = 0
    d2h: int = 0
    h2d: int = 0
    grads: str = ""
    cpu_step: float = 0.0
    h100_step: float | None = None
    note: str = ""


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (bytes; CPU milliseconds measured, H100 microseconds
    predicted)."""
    head = (
        "| model | method | budget B | device peak B (measured) | host peak B (measured) "
        "| d2h / h2d B (measured) | grads | CPU step ms (measured) | H100 step us (predicted) "
        "| note |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        h100 = "-" if r.h100_step is None else f"{r.h100_step * 1e6:.1f}"
        cpu = f"{r.cpu_step * 1e3:.2f}" if r.cpu_step else "-"
        lines.append(
            f"| {r.model} | {r.method} | {_cell(r.budget)} | {_cell(r.device_peak)} "
            f"| {r.host_peak:,} | {r.d2h:,} / {r.h2d:,} | {r.grads or '-'} | {cpu} | {h100} "
            f"| {r.note} |"
        )
    return "\n".join(lines)
