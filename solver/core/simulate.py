"""Independent checker of the execution semantics: validity, peak memory and cost of a schedule.

Semantics (the README and docs/offload.md state the same):

- `("compute", v)` is valid only if every predecessor of v is live and v itself is not live;
  v becomes live.
- `("free", v)` is valid only if v is live; v stops being live.
- every node is computed at least once.
- peak = the maximum, over compute ops, of the sum of `mem` over live values just after that
  compute (the new value and its still-live inputs included) plus the computed node's
  `transient` bytes (0 when absent), and over reload ops of the bytes live just after it.
  Frees never raise the peak.
- cost = the sum of `cost` over compute ops, plus, with a host link, the time the compute
  stream waits for copies (the stall).

With a `Link` (docs/offload.md), `("offload", v)` copies a live v to the host (at most once per
value) and `("reload", v)` copies it back (v offloaded before and not live; v becomes live).
One clock, the compute stream's: a compute advances it by the node's cost, after waiting for
the reloads of its inputs still arriving; a free waits for the end of v's offload and of the
reload that made this copy; an offload (reload) is issued at the clock and runs on its
direction's engine (on the one engine of a link that is not `duplex`), one copy at a time in
issue order, a reload not before its value's offload has ended, each taking its direction's
latency plus its bytes over its bandwidth. The cost is the time at which the clock and the
engines are done. A host copy holds `link.host_bytes(mem)` bytes from its offload until the
compute stream has waited for the end of its value's last reload (the first compute that reads
the reloaded value, or its free), through the offload itself where never reloaded: a reload
still in flight holds its host buffer. The host peak, after each offload, must be within the
link's `host_memory`.

This module reads the graph's attributes directly and shares no code with the solvers, so that
every schedule they produce is checked by something that did not produce it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import networkx as nx

from solver.core.link import Link
from solver.errors import InvalidScheduleError

Op = tuple[str, Hashable]


@dataclass(frozen=True)
class Simulation:
    """What `simulate` found. `peak` and `host_peak` are in bytes, `cost` and `stall` in the
    graph's cost unit (`cost` includes `stall`: the compute cost is `cost - stall`).

    `computes` counts compute ops, `recomputes` the compute ops beyond each node's first,
    `offloads` and `reloads` the copies. `error` is None for a valid schedule, else the first
    violation (with its op index).
    """

    valid: bool
    peak: int
    cost: float
    computes: int
    recomputes: int
    error: str | None
    stall: float = 0.0
    host_peak: int = 0
    offloads: int = 0
    reloads: int = 0

    def raise_if_invalid(self) -> None:
        """Raise InvalidScheduleError with the first violation when the schedule is invalid."""
        if not self.valid:
            raise InvalidScheduleError(f"invalid schedule: {self.error}")


def simulate(graph: nx.DiGraph, ops: Iterable[Op], link: Link | None = None) -> Simulation:
    """Replay `ops` on `graph` (with `link`, its offload and reload ops too) and return validity,
    peak bytes and total cost.

    Runs in O(len(ops) * max in-degree). Never raises on a bad schedule: the result says why it
    is invalid (call `raise_if_invalid()` to turn that into an exception).
    """
    ops = list(ops)
    live: set[Hashable] = set()
    computed: set[Hashable] = set()
    live_bytes = 0
    peak = 0
    costs: list[float] = []
    computes = 0
    recomputes = 0
    clock = 0.0  # the compute stream's time
    waited = 0.0
    d2h_free = h2d_free = 0.0  # when each copy engine is next idle (equal: one shared engine)
    offload_end: dict[Hashable, float] = {}
    arrival: dict[Hashable, float] = {}  # end of the reload that made v's live copy
    last_reload = {op[1]: step for step, op in _indexed(ops) if op[0] == "reload"}
    releasing: set[Hashable] = set()  # last reload issued, not yet waited for: still held
    host_bytes = host_peak = 0
    offloads = reloads = 0

    def result(error: str | None) -> Simulation:
        end = max(clock, d2h_free, h2d_free)
        stall = waited + (end - clock)
        return Simulation(
            error is None,
            peak,
            math.fsum(costs) + stall,
            computes,
            recomputes,
            error,
            stall,
            host_peak,
            offloads,
            reloads,
        )

    def wait(until: float) -> None:
        nonlocal clock, waited
        if until > clock:
            waited += until - clock
            clock = until

    def release(v: Hashable) -> None:
        """The clock has waited for v's last reload: its host copy is held no longer."""
        nonlocal host_bytes
        if v in releasing:
            assert link is not None
            releasing.remove(v)
            host_bytes -= link.host_bytes(graph.nodes[v]["mem"])

    for step, op in enumerate(ops):
        if not (isinstance(op, tuple | list) and len(op) == 2):
            return result(f"op {step}: {op!r} is not a (kind, node) pair")
        kind, v = op
        if v not in graph:
            return result(f"op {step}: {kind} of unknown node {v!r}")
        mem = graph.nodes[v]["mem"]
        if kind in ("offload", "reload") and link is None:
            return result(f"op {step}: {kind} {v!r} needs a host link (simulate(..., link=))")
        if kind == "compute":
            if v in live:
                return result(f"op {step}: compute {v!r} while it is already live")
            missing = [u for u in graph.predecessors(v) if u not in live]
            if missing:
                return result(f"op {step}: compute {v!r} needs {missing[0]!r}, which is not live")
            for u in graph.predecessors(v):
                wait(arrival.get(u, 0.0))
                release(u)
            clock += graph.nodes[v]["cost"]
            live.add(v)
            live_bytes += mem
            peak = max(peak, live_bytes + graph.nodes[v].get("transient", 0))
            costs.append(graph.nodes[v]["cost"])
            computes += 1
            if v in computed:
                recomputes += 1
            computed.add(v)
        elif kind == "free":
            if v not in live:
                return result(f"op {step}: free {v!r}, which is not live")
            wait(offload_end.get(v, 0.0))
            wait(arrival.pop(v, 0.0))
            release(v)
            live.remove(v)
            live_bytes -= mem
        elif kind == "offload":
            assert link is not None
            if v not in live:
                return result(f"op {step}: offload {v!r}, which is not live")
            if v in offload_end:
                return result(f"op {step}: offload {v!r} a second time (once per value)")
            d2h_free = max(clock, d2h_free) + link.d2h_latency + mem / link.d2h
            if not link.duplex:  # one engine: the next reload queues behind this copy
                h2d_free = d2h_free
            offload_end[v] = d2h_free
            offloads += 1
            host_bytes += link.host_bytes(mem)
            host_peak = max(host_peak, host_bytes)
            if link.host_memory is not None and host_bytes > link.host_memory:
                return result(
                    f"op {step}: offload {v!r} puts {host_bytes} bytes on the host, over the "
                    f"link's host_memory of {link.host_memory}"
                )
            if v not in last_reload or last_reload[v] < step:  # never reloaded: held no longer
                host_bytes -= link.host_bytes(mem)
        elif kind == "reload":
            assert link is not None
            if v not in offload_end:
                return result(f"op {step}: reload {v!r}, which was never offloaded")
            if v in live:
                return result(f"op {step}: reload {v!r} while it is already live")
            h2d_free = max(clock, h2d_free, offload_end[v]) + link.h2d_latency + mem / link.h2d
            if not link.duplex:
                d2h_free = h2d_free
            arrival[v] = h2d_free
            reloads += 1
            live.add(v)
            live_bytes += mem
            peak = max(peak, live_bytes)
            if last_reload[v] == step:  # held until the compute stream waits for this copy
                releasing.add(v)
        else:
            return result(
                f"op {step}: unknown op kind {kind!r} (expected 'compute', 'free', 'offload' or "
                "'reload')"
            )
    never = [v for v in graph.nodes if v not in computed]
    if never:
        return result(f"node {never[0]!r} is never computed ({len(never)} nodes never computed)")
    return result(None)


def _indexed(ops: list) -> Iterable[tuple[int, tuple]]:
    """(step, op) for the well-formed (kind, node) pairs of `ops` (the others are reported
    where the replay reaches them)."""
    for step, op in enumerate(ops):
        if isinstance(op, tuple | list) and len(op) == 2:
            try:
                hash(op[1])
            except TypeError:
                continue
            yield step, op
