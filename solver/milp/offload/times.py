"""The whole units the exact offload model (`solver.milp.offload.model`) counts time in: each
node's compute, offload and reload time over a link, exact where they can be, else rounded."""

from __future__ import annotations

from dataclasses import dataclass

from solver.core.graph import Problem
from solver.core.link import Link
from solver.milp.units import CostUnits


@dataclass(frozen=True)
class OffloadTimes:
    """The whole units the model counts time in: `cost[i]`, `d2h[i]`, `h2d[i]` per node (its
    compute, its offload, its reload), `units` to read them back in graph units, and whether
    they are `exact` (else some were rounded)."""

    cost: tuple[int, ...]
    d2h: tuple[int, ...]
    h2d: tuple[int, ...]
    units: CostUnits
    exact: bool

    @classmethod
    def of(cls, problem: Problem, link: Link) -> OffloadTimes:
        """The costs and copy times in one set of whole units: exact where some power of ten
        up to 10**6 makes them all whole (`CostUnits.whole`) and their sum is at most
        `MAX_UNITS`; otherwise rounded at a resolution of their sum over `MAX_UNITS` (CP-SAT
        needs the sum of its variables' domains within 64 bits)."""
        n = problem.n
        d2h = [link.offload_time(m) for m in problem.mem]
        h2d = [link.reload_time(m) for m in problem.mem]
        values = [*problem.cost, *d2h, *h2d]
        units = CostUnits.whole(values)
        exact = bool(units.scale) and sum(units.int_cost) <= MAX_UNITS
        if not exact:
            unit = sum(values) / MAX_UNITS
            units = CostUnits(tuple(round(v / unit) for v in values), unit)
        whole = units.int_cost
        return cls(whole[:n], whole[n : 2 * n], whole[2 * n :], units, exact)

    @property
    def rounding(self) -> float:
        """Graph units by which a timeline's end in these units can differ from its end in graph
        units: 0 where the times are exact, else half a unit for each of the at most n^2 + n
        durations on its path (computes n(n+1)/2, offloads n, reloads n(n-1)/2). A bound in
        these units, less this, bounds the true times (`fit` compares it so with its cap)."""
        if self.exact:
            return 0.0
        n = len(self.cost)
        return n * (n + 1) * self.units.to_graph(1) / 2


MAX_UNITS = 10**9
"""Whole units the costs and copy times of all nodes sum to at most: the clocks' domains stay
within what CP-SAT checks for overflow (their sum within 64 bits) on graphs of thousands of
nodes."""
