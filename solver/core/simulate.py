"""Independent checker of the execution semantics: validity, peak memory and cost of a schedule.

Semantics (the README states the same):

- `("compute", v)` is valid only if every predecessor of v is live and v itself is not live;
  v becomes live.
- `("free", v)` is valid only if v is live; v stops being live.
- every node is computed at least once.
- peak = the maximum, over compute ops, of the sum of `mem` over live values just after that
  compute (the new value and its still-live inputs included) plus the computed node's
  `transient` bytes (0 when absent). Frees never raise the peak.
- cost = the sum of `cost` over compute ops.

This module reads the graph's attributes directly and shares no code with the solvers, so that
every schedule they produce is checked by something that did not produce it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import networkx as nx

from solver.errors import InvalidScheduleError

Op = tuple[str, Hashable]


@dataclass(frozen=True)
class Simulation:
    """What `simulate` found. `peak` is in bytes, `cost` in the graph's cost unit.

    `computes` counts compute ops, `recomputes` the compute ops beyond each node's first.
    `error` is None for a valid schedule, else the first violation (with its op index).
    """

    valid: bool
    peak: int
    cost: float
    computes: int
    recomputes: int
    error: str | None

    def raise_if_invalid(self) -> None:
        """Raise InvalidScheduleError with the first violation when the schedule is invalid."""
        if not self.valid:
            raise InvalidScheduleError(f"invalid schedule: {self.error}")


def simulate(graph: nx.DiGraph, ops: Iterable[Op]) -> Simulation:
    """Replay `ops` on `graph` and return validity, peak bytes and total cost.

    Runs in O(len(ops) * max in-degree). Never raises on a bad schedule: the result says why it
    is invalid (call `raise_if_invalid()` to turn that into an exception).
    """
    live: set[Hashable] = set()
    computed: set[Hashable] = set()
    live_bytes = 0
    peak = 0
    costs: list[float] = []
    computes = 0
    recomputes = 0

    def result(error: str | None) -> Simulation:
        return Simulation(error is None, peak, math.fsum(costs), computes, recomputes, error)

    for step, op in enumerate(ops):
        if not (isinstance(op, tuple | list) and len(op) == 2):
            return result(f"op {step}: {op!r} is not a (kind, node) pair")
        kind, v = op
        if v not in graph:
            return result(f"op {step}: {kind} of unknown node {v!r}")
        if kind == "compute":
            if v in live:
                return result(f"op {step}: compute {v!r} while it is already live")
            missing = [u for u in graph.predecessors(v) if u not in live]
            if missing:
                return result(f"op {step}: compute {v!r} needs {missing[0]!r}, which is not live")
            live.add(v)
            live_bytes += graph.nodes[v]["mem"]
            peak = max(peak, live_bytes + graph.nodes[v].get("transient", 0))
            costs.append(graph.nodes[v]["cost"])
            computes += 1
            if v in computed:
                recomputes += 1
            computed.add(v)
        elif kind == "free":
            if v not in live:
                return result(f"op {step}: free {v!r}, which is not live")
            live.remove(v)
            live_bytes -= graph.nodes[v]["mem"]
        else:
            return result(f"op {step}: unknown op kind {kind!r} (expected 'compute' or 'free')")
    never = [v for v in graph.nodes if v not in computed]
    if never:
        return result(f"node {never[0]!r} is never computed ({len(never)} nodes never computed)")
    return result(None)
