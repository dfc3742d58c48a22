"""Parsing of memory budgets (bytes) and compute budgets (cost units) given as text."""

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


def parse_budget(text: str | int | float, problem: Problem) -> int:
    """Memory budget in bytes from `123456`, `512MiB`, `1.5 GiB`, `2GB` or `80%`.

    A percentage is of the checkpoint-all peak (`checkpoint_all_peak`), rounded down; a count
    of bytes without a unit must be whole (`0.5` is refused rather than read as 0 bytes).
    """
    return parse_bytes(text, lambda: checkpoint_all_peak(problem))


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
            "2GB) or a percentage of the checkpoint-all peak (80%)"
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
            "units (512MiB) or a percentage of the checkpoint-all peak (50%)"
        )
    return int(value)


def parse_compute_budget(text: str | int | float, problem: Problem) -> float:
    """Compute budget in cost units from `1.25x` (times the checkpoint-all cost) or a number."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    s = str(text).strip().lower()
    try:
        if s.endswith("x"):
            return float(s[:-1]) * problem.total_cost
        return float(s)
    except ValueError:
        raise ValueError(
            f"cannot read compute budget {text!r}: use a multiple of the checkpoint-all cost "
            "(1.2x) or an absolute cost in the graph's unit"
        ) from None


def human_bytes(n: float) -> str:
    """Bytes as text with a binary unit, e.g. 1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
