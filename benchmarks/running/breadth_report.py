"""The breadth benchmark's cells as results: the `Cell` record, a refusal's one line
(`_refusal`), the per-cell table (streamed as the rows run), the grid (one row per
architecture, one column per runtime: the report's table) and the summary per result kind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

COLUMNS = (
    "architecture",
    "family",
    "runtime",
    "result",
    "checkpointed",
    "measured peak",
    "budget",
    "seconds",
)
KINDS = (
    "equal",
    "close",
    "as torch.compile",
    "WRONG",
    "over budget",
    "refused",
    "NOT REPRODUCIBLE",
    "as eager",
    "skipped",
)


@dataclass
class Cell:
    """One architecture in one runtime: the result and its numbers (bytes, seconds)."""

    architecture: str
    family: str
    runtime: str
    result: str
    checkpointed: str = "-"
    peak: int | None = None
    budget: int | None = None
    seconds: float = 0.0
    differs_at: int | None = None

    def markdown(self) -> str:
        values = (
            self.architecture,
            self.family,
            self.runtime,
            self.result.replace("|", "\\|"),
            self.checkpointed,
            _mib(self.peak),
            _mib(self.budget),
            f"{self.seconds:.1f}",
        )
        return "| " + " | ".join(values) + " |"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f} MiB"


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _refusal(error: BaseException) -> str:
    """``refused: Type: first line``, with the chained cause's where there is one."""
    cause = f" (from {_one_line(error.__cause__)})" if error.__cause__ is not None else ""
    return f"refused: {_one_line(error)}{cause}"


def table(cells: Sequence[Cell]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "\n".join(cell.markdown() for cell in cells) + "\n"


def grid(cells: Sequence[Cell]) -> str:
    """One row per architecture, one column per runtime (in the cells' order): each entry the
    result, what it checkpointed and the measured peak (of the budget, where one was given)."""
    runtimes = list(dict.fromkeys(c.runtime for c in cells))
    rows: dict[tuple[str, str], dict[str, Cell]] = {}
    for cell in cells:
        rows.setdefault((cell.architecture, cell.family), {})[cell.runtime] = cell
    head = ["architecture", "family", *runtimes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (architecture, family), by_runtime in rows.items():
        entries = [_entry(by_runtime[r]) if r in by_runtime else "-" for r in runtimes]
        lines.append("| " + " | ".join([architecture, family, *entries]) + " |")
    return "\n".join(lines) + "\n"


def _entry(cell: Cell) -> str:
    """``result; checkpointed; peak [of budget]`` for the grid."""
    peak = _mib(cell.peak) if cell.budget is None else f"{_mib(cell.peak)} of {_mib(cell.budget)}"
    parts = [cell.result.replace("|", "\\|")]
    parts += [cell.checkpointed] if cell.checkpointed != "-" else []
    parts += [peak] if cell.peak is not None else []
    return "; ".join(parts)


def summary(cells: Sequence[Cell]) -> str:
    """Cells per result; equal runtime cells whose schedule or plan checkpoints nothing (so that
    they test little) are counted apart."""
    counts = {k: sum(c.result.startswith(k) for c in cells) for k in KINDS}
    idle = sum(c.result == "equal" and c.checkpointed.startswith("0 ") for c in cells)
    parts = [f"{n} {k}" for k, n in counts.items() if n]
    if idle:
        parts[0] += f" ({idle} of them checkpointing nothing)"
    return ", ".join(parts) + f" of {len(cells)} cells"


def report(cells: Sequence[Cell], command: str) -> str:
    """The markdown report: the command, the summary, the grid."""
    return f"`{command}`: {summary(cells)}\n\n{grid(cells)}"
