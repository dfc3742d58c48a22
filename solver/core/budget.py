"""Budgets as the user gives them, the one place their spellings are defined.

Memory budgets (`Budget.of`, the one parser; `parse_budget` for a graph's bytes) are of four
kinds:

- bytes: a bare number is bytes (whole); text is bytes with a unit (`512MiB`, `1.5GiB`, `2GB`);
- percent: `50%` of a basis the runtime names. For a graph, 100% is the peak of the plain
  training step (forward and backward without checkpointing, bytes above what exists before
  the step, its gradients created in it) where the graph carries one (the graph attribute
  `plain_peak`: measured by capture and by `checkpoint_plan`, or in estimate mode predicted,
  which the graph attribute `plain_peak_basis` = "predicted" says), and the modelled
  checkpoint-all peak (`checkpoint_all_peak`) for a graph without (the published graphs):
  `hundred_percent` says which;
- least: `"min"`, the least peak any schedule (or plan) reaches, and at that peak the least
  recompute cost: a solve finds its bytes (`solver.solve`, `solver.sac.solve.solve_sac`);
- usable: None where a device is known, what it lets PyTorch allocate
  (`solver.target.Device.usable`: its capacity less the process's memory outside PyTorch).

Compute budgets and overhead caps (`parse_compute_budget`; `fit`'s `compute_budget`): a bare
number, or one with an `x` (`1.3`, `"1.3x"`), is a factor of computing every node once;
an absolute cost in the graph's units (seconds for captured graphs) is spelled with the unit
`units` (`"0.02units"`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from solver.core.graph import Problem
from solver.core.stages import checkpoint_all
from solver.errors import ArgumentError, BudgetError

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
        raise ArgumentError(f"plain peak basis {basis!r} is not one of {BASES}")
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


BYTES, PERCENT, LEAST, USABLE = "bytes", "percent", "least", "usable"
"""The kinds of `Budget`."""


@dataclass(frozen=True)
class Budget:
    """A memory budget as given, read (`Budget.of`); its bytes where a runtime knows its basis
    (`bytes`). ``kind``: `BYTES` (``value`` bytes), `PERCENT` (``value`` percent of a basis),
    `LEAST` ("min") or `USABLE` (None: a device's usable memory); ``text``: as given, for
    messages."""

    kind: str
    value: float = 0.0
    text: str = ""

    @classmethod
    def of(cls, budget: Budget | str | int | float | None) -> Budget:
        """The budget `budget` spells: bytes (`123456`, `"512MiB"`, `"1.5 GiB"`, `"2GB"`), a
        percentage (`"80%"`), `"min"` (any case) or None (a device's usable memory); a
        `Budget` as it is. `BudgetError` for anything else, and for a count of bytes that is
        not whole (`0.5` is refused rather than read as 0 bytes)."""
        if isinstance(budget, Budget):
            return budget
        if budget is None:
            return cls(USABLE, text="None")
        if isinstance(budget, int | float) and not isinstance(budget, bool):
            return cls(BYTES, _whole_bytes(budget, budget), repr(budget))
        s = str(budget).strip().lower().replace(" ", "")
        if s == "min":
            return cls(LEAST, text="min")
        match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)(%|[kmgt]?i?b?)", s)
        if isinstance(budget, bool) or not match:
            raise BudgetError(
                f"cannot read memory budget {budget!r}: use bytes (1048576), units (512MiB, "
                "1.5GiB, 2GB), a percentage of the plain step's peak (80%) or 'min'"
            )
        value, unit = float(match.group(1)), match.group(2)
        if unit == "%":
            return cls(PERCENT, value, str(budget))
        if unit not in _UNITS:
            raise BudgetError(f"unknown unit in memory budget {budget!r}")
        whole = _whole_bytes(value, budget) if _UNITS[unit] == 1 else int(value * _UNITS[unit])
        return cls(BYTES, whole, str(budget))

    @property
    def least(self) -> bool:
        """Whether this is "min", the least peak (its bytes are a solve's)."""
        return self.kind == LEAST

    def bytes(
        self,
        hundred: Callable[[], int] | None = None,
        usable: Callable[[], int] | None = None,
    ) -> int:
        """The budget in bytes: a percentage of ``hundred()`` bytes (rounded down), a device's
        usable memory ``usable()``, each called only for its kind. `BudgetError` for "min"
        (a solve finds its bytes) and for a kind whose basis is not given."""
        if self.kind == BYTES:
            return int(self.value)
        if self.kind == PERCENT and hundred is not None:
            return int(self.value / 100 * hundred())
        if self.kind == USABLE and usable is not None:
            return usable()
        if self.kind == LEAST:
            raise BudgetError(
                "'min' is the least peak a solve finds, not a number of bytes given before it: "
                "give bytes, units or a percentage here"
            )
        if self.kind == USABLE:
            raise BudgetError(
                "a budget (or fit's memory) of None stands for a target device's usable "
                "memory, and no target is given: give bytes or a target"
            )
        raise BudgetError(f"a percentage ({self.text}) has no basis here: give bytes or units")


def parse_budget(text: Budget | str | int | float, problem: Problem) -> int:
    """Memory budget in bytes from `123456`, `512MiB`, `1.5 GiB`, `2GB` or `80%` (`Budget.of`).

    A percentage is of `hundred_percent(problem)`, rounded down; a count of bytes without a
    unit must be whole (`0.5` is refused rather than read as 0 bytes); "min" is refused
    (`solver.solve` takes it).
    """
    return Budget.of(text).bytes(lambda: hundred_percent(problem)[0])


def _whole_bytes(value: float, text: object) -> int:
    """`value` as a whole number of bytes; BudgetError naming `text` otherwise."""
    if not math.isfinite(value) or value != int(value):
        raise BudgetError(
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
        raise BudgetError(
            f"cannot read compute budget {text!r}: give a factor of computing every node once "
            "(1.2 or 1.2x) or an absolute cost in the graph's units (0.02units)"
        )
    value = float(match.group(1))
    return value if match.group(2) == "units" else value * problem.total_cost


def parse_overhead(compute_budget: float | str | None) -> str | None:
    """A compute cap, a factor of computing every node once (1.3 or "1.3x"), as the text
    `parse_compute_budget` reads ("1.3x"); None stays None (no cap). BudgetError below 1.0."""
    if compute_budget is None:
        return None
    text = str(compute_budget).strip().lower().removesuffix("x")
    try:
        value = float(text)
    except ValueError:
        raise BudgetError(
            f"compute budget {compute_budget!r} is not a number like 1.3 or 1.3x"
        ) from None
    if not value >= 1.0:
        raise BudgetError(
            f"compute budget {compute_budget!r} is below 1.0: a step computes every node at least "
            "once (1.0x is no recomputation; 1.3x allows 30% more)"
        )
    return f"{value}x"


def human_bytes(n: float) -> str:
    """Bytes as text with a binary unit, e.g. 1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"
