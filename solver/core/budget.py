"""Budgets as the user gives them, the one place their spellings are defined.

Memory budgets (`parse_budget`, `parse_bytes`): a bare number is bytes (whole); text is bytes
with a unit (`512MiB`, `1.5GiB`, `2GB`) or a percentage (`50%`). 100% is the peak of the plain
training step (forward and backward without checkpointing, bytes above what exists before the
step, its gradients created in it) where the graph carries one (the graph attribute
`plain_peak`: measured by capture and by `checkpoint_plan`, or in estimate mode predicted, which
the graph attribute `plain_peak_basis` = "predicted" says), and the modelled checkpoint-all peak
(`checkpoint_all_peak`) for a graph without (the published graphs): `hundred_percent` says
which.

Compute budgets and overhead caps (`parse_compute_budget`; `fit`'s `max_overhead`): a bare
number, or one with an `x` (`1.3`, `"1.3x"`), is a factor of computing every node once;
an absolute cost in the graph's units (seconds for captured graphs) is spelled with the unit
`units` (`"0.02units"`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from solver.core.graph import Problem
from solver.core.stages import checkpoint_all

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def checkpoint_all_peak(problem: Problem) -> int:
    """Peak bytes of the plain schedule: every node once in order, freed after its last use."""
    return checkpoint_all(problem).peak


PLAIN_STEP = "the measured plain step"
PREDICTED_PLAIN_STEP = "the predicted plain step"
CHECKPOINT_ALL = "the modelled checkpoint-all peak"
BASES = ("measured", "predicted")
"""Values of `plain_peak_basis`: how a plain step's peak was had."""


def plain_step(basis: str) -> str:
    """The name of 100% for a plain peak `basis` ("measured" or "predicted")."""
    if basis not in BASES:
        raise ValueError(f"plain peak basis {basis!r} is not one of {BASES}")
    return PLAIN_STEP if basis == "measured" else PREDICTED_PLAIN_STEP


def hundred_percent(problem: Problem) -> tuple[int, str]:
    """(bytes, basis) of 100% for `problem`: its plain step (`Problem.plain_peak`, measured or
    predicted as `Problem.plain_peak_basis` says) where it has one, else its modelled
    checkpoint-all peak; `basis` names which."""
    if problem.plain_peak is not None:
        return problem.plain_peak, plain_step(problem.plain_peak_basis)
    return checkpoint_all_peak(problem), CHECKPOINT_ALL


def percent_of(n: int, problem: Problem) -> str:
    """`n` bytes as a percentage budget of `problem`, naming its basis (`as_percent`)."""
    return as_percent(n, *hundred_percent(problem))


def as_percent(n: int, hundred: int, basis: str) -> str:
    """`n` bytes as a percentage of `hundred` bytes, naming `basis`: "316.5% of the measured
    plain step", rounded up at 0.1% so that the percentage fits where `n` does; where `hundred`
    is 0 (a graph of no bytes) no percentage says more than the bytes."""
    if hundred <= 0:
        return f"no percentage: {basis} is 0 bytes"
    return f"{math.ceil(n * 1000 / hundred) / 10:g}% of {basis}"


def parse_budget(text: str | int | float, problem: Problem) -> int:
    """Memory budget in bytes from `123456`, `512MiB`, `1.5 GiB`, `2GB` or `80%`.

    A percentage is of `hundred_percent(problem)`, rounded down; a count of bytes without a
    unit must be whole (`0.5` is refused rather than read as 0 bytes).
    """
    return parse_bytes(text, lambda: hundred_percent(problem)[0])


def parse_bytes(text: str | int | float, hundred_percent: Callable[[], int]) -> int:
    """`parse_budget` with the bytes of 100% given by `hundred_percent()` (called only for a
    percentage)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return _whole_bytes(text, text)
    s = str(text).strip().lower().replace(" ", "")
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)(%|[kmgt]?i?b?)", s)
    if not match:
        raise ValueError(
            f"cannot read memory budget {text!r}: use bytes (1048576), units (512MiB, 1.5GiB, "
            "2GB) or a percentage of the plain step's peak (80%)"
        )
    value, unit = float(match.group(1)), match.group(2)
    if unit == "%":
        return int(value / 100 * hundred_percent())
    if unit not in _UNITS:
        raise ValueError(f"unknown unit in memory budget {text!r}")
    if _UNITS[unit] == 1:
        return _whole_bytes(value, text)
    return int(value * _UNITS[unit])


def _whole_bytes(value: float, text: object) -> int:
    """`value` as a whole number of bytes; ValueError naming `text` otherwise."""
    if not math.isfinite(value) or value != int(value):
        raise ValueError(
            f"memory budget {text!r} is not a whole number of bytes: give bytes (1048576), "
            "units (512MiB) or a percentage of the plain step's peak (50%)"
        )
    return int(value)


def parse_compute_budget(text: str | int | float, problem: Problem) -> float:
    """Compute budget in cost units: `1.3` or `"1.3x"` is 1.3 times the cost of computing every
    node once (`Problem.total_cost`); `"0.02units"` is that absolute cost in the graph's
    units."""
    s = str(text).strip().lower()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(x|units)?", s)
    if isinstance(text, bool) or not match:
        raise ValueError(
            f"cannot read compute budget {text!r}: give a factor of computing every node once "
            "(1.2 or 1.2x) or an absolute cost in the graph's units (0.02units)"
        )
    value = float(match.group(1))
    return value if match.group(2) == "units" else value * problem.total_cost


def parse_overhead(max_overhead: float | str | None) -> str | None:
    """A compute cap, a factor of computing every node once (1.3 or "1.3x"), as the text
    `parse_compute_budget` reads ("1.3x"); None stays None (no cap). ValueError below 1.0."""
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


def human_bytes(n: float) -> str:
    """Bytes as text with a binary unit, e.g. 1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
