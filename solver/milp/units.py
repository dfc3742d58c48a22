"""The integer cost units of the 0/1 models, and the safe reading of floating-point bounds.

CP-SAT needs integer costs. `CostUnits.of` scales the graph's costs into whole numbers; every
cost a model states (its objective, caps, bounds, the recompute limit) is in these units and
counts recomputations only: a schedule's cost in graph units is
`(recompute cost + units.first) * units.unit` (`CostUnits.graph_cost`).

NOTE [safe bounds]: a bound an engine states is read in whole cost units, and how depends on the
arithmetic behind it.
- CP-SAT works in integers: its bounds are exact whole numbers (handed over as floats, exact
  below 2**53), read by `integer_floor` with no margin, so that a proof at the incumbent's value
  closes the search whatever the unit the costs are written in.
- An LP bound is certified from the row duals with every rounding error bounded
  (`solver.milp.lp.safe_bound`): a whole number already.
- HiGHS's branch and cut (`solver.milp.highs_mip`) states a floating-point dual bound while it
  runs; it is used only as `safe_floor(b)`: rounded up to a whole cost unit after taking off
  SAFE_RELATIVE of it (10x HiGHS's tolerances of 1e-7 on models scaled to unit row norms), so
  that a bound read at 1130.0000004 is 1130, never 1131. Its verdicts at an integer cap
  (infeasible; optimal) are statements in whole units and need no margin
  (`solver.milp.model.ModelResult.proven`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from solver.core.graph import Problem
from solver.core.stages import IndexedSchedule

SAFE_RELATIVE = 1e-6
"""Share of a floating-point bound taken off before it is rounded up (NOTE [safe bounds])."""

MAX_SCALE_DIGITS = 6
"""Costs are scaled by at most 10**MAX_SCALE_DIGITS to make them whole, else rounded."""


def integer_floor(bound: float) -> int:
    """The whole cost units an integer engine's bound (CP-SAT's: a whole number handed over as a
    float) certifies, with no margin (NOTE [safe bounds]); 0 for one not finite or not positive.
    A bound that were not whole would be read below its ceiling, never above."""
    if not math.isfinite(bound) or bound <= 0:
        return 0
    return max(0, math.ceil(bound - 0.5))


def safe_floor(bound: float) -> int:
    """The largest whole cost unit that a floating-point lower bound `bound` certifies, with the
    margin of NOTE [safe bounds]; 0 for a bound that is not finite or not positive."""
    if not math.isfinite(bound) or bound <= 0:
        return 0
    return max(0, math.ceil(bound - SAFE_RELATIVE * max(1.0, bound)))


@dataclass(frozen=True)
class CostUnits:
    """int_cost[i]: node i's cost in whole units; a graph cost is int_cost * unit. `scale` is
    1 / unit where that is a power of ten (costs scaled to whole numbers; graph costs are then
    divided by it, exactly as the decimals read), else 0 (costs rounded)."""

    int_cost: tuple[int, ...]
    unit: float
    scale: int = 0

    @classmethod
    def of(cls, problem: Problem) -> CostUnits:
        """Whole-number costs are used as they are (unit 1, exact). Otherwise costs are scaled
        by the smallest power of ten that makes them whole (to 1e-9), at most
        10**MAX_SCALE_DIGITS; failing that, rounded at a resolution of max(cost) / 1e6."""
        return cls.whole(problem.cost)

    @classmethod
    def whole(cls, values: Sequence[float]) -> CostUnits:
        """The units of `of` for any times in graph units (costs, and copy times with
        offload: `solver.milp.offload.times`), `int_cost` holding each value in them."""
        for digits in range(MAX_SCALE_DIGITS + 1):
            scale = 10**digits
            if all(abs(c * scale - round(c * scale)) <= 1e-9 * max(1.0, c * scale) for c in values):
                return cls(tuple(round(c * scale) for c in values), 1.0 / scale, scale)
        unit = max(values) / 10**MAX_SCALE_DIGITS
        return cls(tuple(round(c / unit) for c in values), unit)

    def to_graph(self, units: float) -> float:
        """A time of `units` whole units in graph units."""
        return units / self.scale if self.scale else units * self.unit

    @cached_property
    def first(self) -> int:
        """Units of computing every node once: what every schedule spends besides recomputes."""
        return sum(self.int_cost)

    def recompute(self, schedule: IndexedSchedule) -> int:
        """A schedule's recompute cost in units (its computes beyond each node's first)."""
        return sum(self.int_cost[i] for kind, i in schedule.ops if kind == "compute") - self.first

    def graph_cost(self, recompute: float) -> float:
        """The cost in graph units of a schedule whose recompute cost is `recompute` units."""
        return self.to_graph(recompute + self.first)
